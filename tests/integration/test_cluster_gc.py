"""`ckptfs gc` on a shared store runs cluster GC (docs/internals/cluster.md,
"Cluster mode: GC"): beside mounted daemons, under the GC lease, deleting a
pack only once it has been unneeded for the grace period, and saying what
it kept and why. The store here is made shared by its superblock's
"shared" flag, as `-o cluster` records it."""
from __future__ import annotations

import json
import os
import random
import time

from conftest import describe, run_ckptfs
from helpers import gen_data


def packs(backing) -> list[str]:
    return sorted(str(p.relative_to(backing)) for p in (backing / "packs").glob("*/*.pack"))


def make_shared(backing) -> None:
    sb = json.loads((backing / "CKPTFS").read_text())
    sb["shared"] = True
    sb["version"] = 2
    (backing / "CKPTFS").write_text(json.dumps(sb) + "\n")


def sealed_store(mount_factory):
    """A store holding files a and b, unmounted and shared, with a's stub
    gone as if another node had deleted it."""
    rng = random.Random(16)
    m = mount_factory(name="gc")
    a, b = gen_data(rng, 3 << 20), gen_data(rng, 2 << 20)
    (m.mnt / "a").write_bytes(a)
    (m.mnt / "b").write_bytes(b)
    m.wait_sealed()
    m.umount()
    m.fsck_at_teardown = False  # gc/ and nodes/ are cluster layout
    make_shared(m.backing)
    assert len(packs(m.backing)) == 2
    os.unlink(m.backing / "ns" / "a")
    return m


def test_gc_keeps_an_unneeded_pack_for_the_grace_period_then_deletes_it(mount_factory):
    m = sealed_store(mount_factory)
    g = run_ckptfs("gc", m.backing)
    assert g.returncode == 0, describe(g)
    assert "deleted 0 pack(s)" in g.stdout and "1 written less than the grace period (600 s) ago" in g.stdout, \
        describe(g)
    assert len(packs(m.backing)) == 2

    g = run_ckptfs("gc", "--grace", "0", m.backing)
    assert g.returncode == 0, describe(g)
    assert "deleted 1 pack(s)" in g.stdout and "kept 1 that files need" in g.stdout, describe(g)
    assert len(packs(m.backing)) == 1
    assert not any((m.backing / "gc" / "doomed").iterdir()), "markers left behind"
    assert not (m.backing / "gc" / "lease").exists(), "the lease was not released"


def test_a_second_collector_is_refused_while_the_lease_is_held(mount_factory):
    m = sealed_store(mount_factory)
    (m.backing / "gc").mkdir(exist_ok=True)
    lease = {"holder": "node7", "token": "t", "expires_ns": int((time.time() + 3600) * 1e9)}
    (m.backing / "gc" / "lease").write_text(json.dumps(lease))
    g = run_ckptfs("gc", "--grace", "0", m.backing)
    assert g.returncode == 2, describe(g)
    assert "held by node7" in g.stderr, describe(g)
    assert len(packs(m.backing)) == 2

    lease["expires_ns"] = int((time.time() - 1) * 1e9)  # its holder died
    (m.backing / "gc" / "lease").write_text(json.dumps(lease))
    g = run_ckptfs("gc", "--grace", "0", m.backing)
    assert g.returncode == 0, describe(g)
    assert len(packs(m.backing)) == 1


def test_grace_is_refused_on_a_single_node_store(mount_factory):
    m = mount_factory(name="single")
    m.umount()
    g = run_ckptfs("gc", "--grace", "0", m.backing)
    assert g.returncode == 2 and "shared (cluster) stores only" in g.stderr, describe(g)
