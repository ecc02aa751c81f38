"""Parameters, config parsing and the errors a bad config gets."""

import pytest

from scheduler import (BandPolicy, CreditPolicy, FifoPolicy, SchedulerConfig,
                       SchedulerParams, make_policy)


def test_defaults_are_gdevs():
    p = SchedulerParams()
    assert p.period_ns == 30_000_000          # GDEV_PERIOD_DEFAULT 30000 us
    assert p.credit_bound == p.period_ns       # GDEV_CREDIT_INACTIVE_THRESHOLD
    assert p.band_wait_ns == 500_000           # yield_chance(500 us)
    assert p.util_window_ns == 1_000_000_000   # GDEV_UPDATE_INTERVAL 1 s


def test_from_dict_folds_units_into_ns():
    p = SchedulerParams.from_dict({"period_ms": 10, "band_wait_us": 50,
                                   "util_window_s": 0.5, "credit_bound_ns": 7,
                                   "util_sample_ms": 30})
    assert (p.period_ns, p.band_wait_ns, p.util_window_ns, p.credit_bound,
            p.util_sample_ns) == (10_000_000, 50_000, 500_000_000, 7, 30_000_000)


@pytest.mark.parametrize("config, field", [
    ({"perod_ms": 30}, "perod_ms"),
    ({"period_ms": 0}, "period_ns"),
    ({"band_wait_us": -1}, "band_wait_ns"),
    ({"period_ms": "30"}, "period_ms"),
    ({"period_ms": 30, "period_us": 30000}, "period_us"),
])
def test_bad_params_name_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        SchedulerParams.from_dict(config)


def test_config_picks_policy_by_name():
    cfg = SchedulerConfig.from_dict({"policy": "CREDIT", "period_ms": 10})
    policy = cfg.build()
    assert isinstance(policy, CreditPolicy) and policy.params.period_ns == 10_000_000
    assert isinstance(SchedulerConfig.from_dict({}).build(), BandPolicy)
    assert isinstance(make_policy("fifo"), FifoPolicy)


def test_unknown_policy_names_the_field():
    with pytest.raises(ValueError, match="policy: unknown scheduler policy 'lottery'"):
        SchedulerConfig.from_dict({"policy": "lottery"})


@pytest.mark.parametrize("share", [0, -1, float("nan"), float("inf"), "1", True])
def test_bad_share_names_the_field(share):
    policy = make_policy("band")
    with pytest.raises(ValueError, match="share"):
        policy.add_vm("vm0", share, 0)


def test_duplicate_and_unknown_vm_name_the_vm():
    policy = make_policy("credit")
    policy.add_vm("vm0", 1, 0)
    with pytest.raises(ValueError, match="vm 'vm0': already added"):
        policy.add_vm("vm0", 1, 0)
    with pytest.raises(ValueError, match="vm 'ghost'"):
        policy.ready("ghost", 0)
