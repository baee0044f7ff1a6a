"""Scenario 5 of issue #4: new_group subgroups with gloo, GLOO_ENABLE_STORE_V2_API=1 (batched
WAIT + MULTI_GET during gloo bootstrap) and TORCH_DIST_INIT_BARRIER=1 (store-based barrier)."""
from conftest import SCRIPTS, read_json


def test_subgroups_store_v2_init_barrier(launcher, procs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = procs.env(GLOO_ENABLE_STORE_V2_API="1", TORCH_DIST_INIT_BARRIER="1")
    r = procs.run(
        launcher.cmd("--standalone", "--nproc-per-node", "4", SCRIPTS / "subgroups.py", "--out", out),
        env=env,
        timeout=300,
    )
    assert r.rc == 0, r.describe()
    for rank in range(4):
        res = read_json(out / f"rank{rank}.json")
        assert res["env"] == {"GLOO_ENABLE_STORE_V2_API": "1", "TORCH_DIST_INIT_BARRIER": "1"}
        assert res["pair_sum"] == (3.0 if rank < 2 else 7.0), res
        assert res["even_sum"] == (4.0 if rank % 2 == 0 else None), res
        assert res["local_bcast"] == float((rank // 2 * 2 + 1) * 10), res
        assert res["gathered"] == [0.0, 1.0, 2.0, 3.0], res
