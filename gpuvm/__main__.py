import sys

from gpuvm.cli import main

sys.exit(main())
