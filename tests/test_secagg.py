"""Secure summation (fedpriv.privacy.secagg): exact sums, dropouts, refusals, channel integrity,
mask independence, the neighbour graph and parameter validation."""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest

from fedpriv.privacy.secagg import (
    SecAggError,
    SecAggNode,
    SecAggParams,
    SecAggServer,
    default_degree,
    default_threshold,
    expand_mask,
    neighbour_graph,
    plan_params,
)

SEED = bytes(range(32))


def random_inputs(ids, length, bits, seed=0):
    rng = np.random.default_rng(seed)
    high = 1 << bits
    if bits == 64:
        return {i: rng.integers(0, 2**64 - 1, length, dtype=np.uint64, endpoint=True) for i in ids}
    return {i: rng.integers(0, high, length, dtype=np.uint64) for i in ids}


def exact_sum(xs, ids, bits):
    # python ints: no wraparound until the final reduction
    total = [sum(int(xs[i][j]) for i in ids) % (1 << bits) for j in range(len(xs[ids[0]]))]
    return np.array(total, dtype=np.uint64)


@dataclass
class Run:
    """A simulated deployment: nodes, server, the messages of one release."""

    params: SecAggParams
    nodes: dict[int, SecAggNode]
    server: SecAggServer
    channel_keys: dict[int, bytes]
    shares: dict = field(default_factory=dict)
    routed: dict = field(default_factory=dict)
    masked: dict = field(default_factory=dict)
    replies: dict = field(default_factory=dict)


def setup(n, bits, degree=None, threshold=None, first_id=10):
    params = plan_params(n, bits, degree, threshold)
    ids = list(range(first_id, first_id + n))
    nodes = {i: SecAggNode(i) for i in ids}
    server = SecAggServer(ids, params, seed=SEED)
    keys = {i: node.channel_key() for i, node in nodes.items()}
    return Run(params, nodes, server, keys)


def do_share(run, release, skip=()):
    run.shares = {
        i: node.share(release, run.params, run.server.channel_keys_for(i, run.channel_keys))
        for i, node in run.nodes.items() if i not in skip
    }
    run.routed = run.server.route(run.shares)


def do_mask(run, release, xs, skip=()):
    run.masked = {i: run.nodes[i].mask(release, xs[i], *run.routed[i])
                  for i in run.routed if i not in skip}


def do_unmask(run, release, skip=()):
    survivors, dropped = run.server.unmask_request(run.shares, run.masked)
    run.replies = {i: run.nodes[i].unmask(release, survivors, dropped)
                   for i in survivors if i not in skip}
    mask_keys = {i: s[0] for i, s in run.shares.items()}
    length = len(next(iter(run.masked.values())))
    return run.server.unmask(release, length, mask_keys, run.masked, run.replies)


def full_release(run, release, xs, drop_share=(), drop_mask=(), no_reply=()):
    do_share(run, release, drop_share)
    do_mask(run, release, xs, drop_mask)
    return do_unmask(run, release, no_reply)


# ------------------------------------------------------------------------------ exact sums


@pytest.mark.parametrize(
    "n, bits, degree",
    [(5, 64, None), (6, 20, 5), (40, 64, None), (40, 20, None), (40, 1, None), (40, 33, 13 + 1)],
)
def test_sum_is_exact(n, bits, degree):
    run = setup(n, bits, degree)
    complete = run.params.degree == n - 1
    assert complete == (n <= 6)
    ids = list(run.nodes)
    xs = random_inputs(ids, 300, bits, seed=n + bits)
    total = full_release(run, b"step-0/sum", xs)
    assert total.dtype == np.uint64
    np.testing.assert_array_equal(total, exact_sum(xs, ids, bits))


def test_max_values_wrap_correctly():
    run = setup(7, 64)
    ids = list(run.nodes)
    xs = {i: np.full(50, 2**64 - 1, dtype=np.uint64) for i in ids}
    total = full_release(run, b"wrap", xs)
    np.testing.assert_array_equal(total, np.full(50, (7 * (2**64 - 1)) % 2**64, dtype=np.uint64))


# ------------------------------------------------------------------------------ dropouts


def responders(run, v, not_responding):
    """The holders of ``v``'s shares that answer: its neighbours, and ``v`` itself (it holds a
    share of its own secrets and reveals its self-mask seed share while it survives)."""
    return [u for u in (*run.server.graph[v], v) if u not in not_responding]


def test_dropouts_within_threshold_are_recovered_exactly():
    run = setup(40, 32)
    k, t = run.params.degree, run.params.threshold
    assert (k, t) == (12, 7)
    v = 20
    neigh = list(run.server.graph[v])
    # k - t = 5 of v's neighbours fail: 2 before share, 2 between share and mask, 1 no reply
    drop_share, drop_mask, no_reply = neigh[:2], neigh[2:4] + [33], neigh[4:5]
    silent = set(drop_share) | set(drop_mask) | set(no_reply)
    for w in run.nodes:  # every node still has >= t neighbours answering the unmask round
        assert len(responders(run, w, silent)) >= t
    ids = list(run.nodes)
    xs = random_inputs(ids, 500, 32, seed=1)
    total = full_release(run, b"drop", xs, drop_share, drop_mask, no_reply)
    survivors = [i for i in ids if i not in set(drop_share) | set(drop_mask)]
    np.testing.assert_array_equal(total, exact_sum(xs, survivors, 32))
    # the nodes that completed share but sent no y were unmasked through their mask keys
    assert set(drop_mask) <= set(run.shares) and not set(drop_mask) & set(run.masked)


@pytest.mark.parametrize("target_drops_after_share", [False, True])
def test_too_many_silent_neighbours_raise(target_drops_after_share):
    run = setup(40, 32)
    k, t = run.params.degree, run.params.threshold
    v = 25
    # survivors that never answer unmask: enough that v's remaining holders number t - 1 (v
    # itself holds a share of its self-mask seed while it survives, none of its mask key)
    no_reply = list(run.server.graph[v])[: k - t + (1 if target_drops_after_share else 2)]
    drop_mask = [v] if target_drops_after_share else []
    ids = list(run.nodes)
    xs = random_inputs(ids, 100, 32)
    silent = set(no_reply) | set(drop_mask)
    short = [w for w in ids if w not in drop_mask and len(responders(run, w, silent)) < t]
    with pytest.raises(SecAggError) as err:
        full_release(run, b"too-many", xs, drop_mask=drop_mask, no_reply=no_reply)
    message = str(err.value)
    if target_drops_after_share:
        assert f"the mask key of nodes [{v}]" in message
    else:
        assert v in short and f"the self-mask seed of nodes {short}" in message
    assert err.value.field == "replies" and (err.value.node in short or err.value.node == v)


def test_fewer_survivors_than_threshold_raise():
    run = setup(6, 16, degree=5, threshold=4)
    ids = list(run.nodes)
    xs = random_inputs(ids, 10, 16)
    do_share(run, b"few", skip=())
    do_mask(run, b"few", xs, skip=ids[:3])  # 3 survivors < t = 4
    with pytest.raises(SecAggError, match="survivors"):
        run.server.unmask_request(run.shares, run.masked)
    with pytest.raises(SecAggError, match="survivors"):
        run.nodes[ids[4]].unmask(b"few", list(run.masked), ids[:3])
    with pytest.raises(SecAggError, match="survivors"):
        run.server.unmask(b"few", 10, {i: s[0] for i, s in run.shares.items()}, run.masked, {})


# ------------------------------------------------------------------------------ refusals


def masked_run(n=8, release=b"refuse"):
    run = setup(n, 32, degree=n - 1)
    ids = list(run.nodes)
    do_share(run, release)
    do_mask(run, release, random_inputs(ids, 20, 32))
    return run, ids


def test_node_refuses_both_shares_of_one_node():
    run, ids = masked_run()
    u, v = ids[0], ids[1]
    first = run.nodes[u].unmask(b"refuse", ids, [])
    assert set(first["self"]) == set(ids) and first["pairwise"] == {}
    alive = [i for i in ids if i != v]
    with pytest.raises(SecAggError) as err:
        run.nodes[u].unmask(b"refuse", alive, [v])  # would hand over v's mask-key share too
    assert err.value.node == v
    # the refused call recorded nothing: the consistent request is still answered, identically
    again = run.nodes[u].unmask(b"refuse", ids, [])
    assert again == first


def test_node_refuses_inconsistent_lists_and_reveals_nothing():
    run, ids = masked_run()
    u, v, w = ids[0], ids[1], ids[2]
    node = run.nodes[u]
    with pytest.raises(SecAggError) as err:
        node.unmask(b"refuse", ids, [v, w])  # v and w listed as both
    assert err.value.node == v
    with pytest.raises(SecAggError, match="itself"):
        node.unmask(b"refuse", ids[1:], [u])
    with pytest.raises(SecAggError, match="no shares"):
        node.unmask(b"other-release", ids, [])
    # nothing was recorded by the refused calls: w may still be treated as a survivor
    reply = node.unmask(b"refuse", [i for i in ids if i != v], [v])
    assert set(reply["self"]) == set(ids) - {v} and set(reply["pairwise"]) == {v}
    # and the mask-key share of v, now revealed, rules out v's self-mask seed share
    with pytest.raises(SecAggError) as err:
        node.unmask(b"refuse", ids, [])
    assert err.value.node == v
    node.forget(b"refuse")
    with pytest.raises(SecAggError, match="no shares"):
        node.unmask(b"refuse", ids, [])


def test_node_refuses_second_mask_and_reused_label():
    run, ids = masked_run()
    u = ids[0]
    with pytest.raises(SecAggError, match="already"):
        run.nodes[u].mask(b"refuse", np.zeros(20, np.uint64), *run.routed[u])
    with pytest.raises(SecAggError, match="already"):
        run.nodes[u].share(b"refuse", run.params, run.server.channel_keys_for(u, run.channel_keys))


# ------------------------------------------------------------------------------ channel


def test_tampered_ciphertext_is_rejected_naming_sender():
    run = setup(6, 32, degree=5)
    do_share(run, b"r1")
    u, v = 10, 13
    keys, cts = run.routed[u]
    bad = bytearray(cts[v])
    bad[-1] ^= 1
    with pytest.raises(SecAggError, match=f"node {v}") as err:
        run.nodes[u].mask(b"r1", np.zeros(4, np.uint64), keys, {**cts, v: bytes(bad)})
    assert err.value.node == v


def test_replayed_ciphertext_is_rejected_naming_sender():
    run = setup(6, 32, degree=5)
    do_share(run, b"r1")
    u, v, w = 10, 13, 14
    keys, cts = run.routed[u]
    # the ciphertext v made for w, presented to u as v's
    other = run.shares[v][1][w]
    with pytest.raises(SecAggError, match=f"node {v}"):
        run.nodes[u].mask(b"r1", np.zeros(4, np.uint64), keys, {**cts, v: other})
    # the ciphertext v made for u in r1, replayed in release r2
    old = cts[v]
    do_share(run, b"r2")
    keys2, cts2 = run.routed[u]
    with pytest.raises(SecAggError, match=f"node {v}"):
        run.nodes[u].mask(b"r2", np.zeros(4, np.uint64), keys2, {**cts2, v: old})
    # the genuine messages still work afterwards
    y = run.nodes[u].mask(b"r2", np.zeros(4, np.uint64), keys2, cts2)
    assert y.shape == (4,)


# ------------------------------------------------------------------------------ masks


def test_masks_of_two_releases_are_independent():
    run = setup(6, 64, degree=5)
    ids = list(run.nodes)
    xs = random_inputs(ids, 200, 64, seed=7)
    total_a = full_release(run, b"step-1/a", xs)
    y_a = dict(run.masked)
    total_b = full_release(run, b"step-1/b", xs)
    y_b = dict(run.masked)
    np.testing.assert_array_equal(total_a, total_b)
    np.testing.assert_array_equal(total_a, exact_sum(xs, ids, 64))
    for i in ids:
        assert np.mean(y_a[i] == y_b[i]) < 0.01
    secret = os.urandom(32)
    m1 = expand_mask(secret, b"step-1/a", 1000, 64)
    m2 = expand_mask(secret, b"step-1/b", 1000, 64)
    assert np.mean(m1 == m2) < 0.01
    np.testing.assert_array_equal(m1, expand_mask(secret, b"step-1/a", 1000, 64))


@pytest.mark.parametrize("bits", [64, 20])
def test_mask_words_look_uniform(bits):
    m = expand_mask(os.urandom(32), b"uniform", 100_000, bits)
    assert m.dtype == np.uint64 and int(m.max()) < 2**bits
    top = (m >> np.uint64(bits - 1)) & np.uint64(1)
    assert abs(top.mean() - 0.5) < 0.01
    low = m & np.uint64(1)
    assert abs(low.mean() - 0.5) < 0.01


def test_single_masked_vector_hides_input():
    run = setup(6, 32, degree=5)
    ids = list(run.nodes)
    xs = random_inputs(ids, 500, 32, seed=3)
    full_release(run, b"hide-1", xs)
    d1 = {i: (run.masked[i] - xs[i]) & np.uint64(2**32 - 1) for i in ids}
    full_release(run, b"hide-2", xs)
    d2 = {i: (run.masked[i] - xs[i]) & np.uint64(2**32 - 1) for i in ids}
    for i in ids:
        assert np.mean(d1[i] == 0) < 0.01
        assert np.mean(d1[i] == d2[i]) < 0.01


# ------------------------------------------------------------------------------ graph


def is_connected(graph):
    start = next(iter(graph))
    seen, todo = {start}, deque([start])
    while todo:
        for v in graph[todo.popleft()]:
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return len(seen) == len(graph)


def check_graph(graph, ids, k):
    assert set(graph) == set(ids)
    for u, neigh in graph.items():
        assert len(neigh) == k == len(set(neigh))
        assert u not in neigh
        for v in neigh:
            assert u in graph[v]
    assert is_connected(graph)


@pytest.mark.parametrize("n, k", [(2, 1), (3, 2), (10, 5), (10, 9), (11, 4), (40, 12), (101, 14)])
def test_graph_is_regular_symmetric_connected(n, k):
    ids = [7 * i + 3 for i in range(n)]
    check_graph(neighbour_graph(ids, k, SEED), ids, k)


def test_graph_large_is_fast_and_logarithmic():
    n = 1000
    k = default_degree(n)
    assert k <= 2 * int(np.ceil(np.log2(n))) + 2
    ids = list(range(n))
    start = time.perf_counter()
    graph = neighbour_graph(ids, k, SEED)
    assert time.perf_counter() - start < 0.5
    check_graph(graph, ids, k)


def test_graph_is_deterministic_given_seed():
    ids = list(range(50))
    g1 = neighbour_graph(ids, 12, SEED)
    assert g1 == neighbour_graph(list(reversed(ids)), 12, SEED)
    assert g1 != neighbour_graph(ids, 12, bytes(32))
    assert SecAggServer(ids, plan_params(50, 32, 12), seed=SEED).graph == g1


def test_default_degree_and_threshold():
    assert default_degree(2) == 1 and default_degree(5) == 4
    assert default_degree(100) == 14
    for n in (2, 3, 7, 9, 31, 100, 1001):
        k = default_degree(n)
        assert 1 <= k <= n - 1 and (n * k) % 2 == 0
    assert default_threshold(14) == 8 and default_threshold(1) == 2 and default_threshold(2) == 2
    assert plan_params(100, 32) == SecAggParams(bits=32, degree=14, threshold=8)


# ------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"bits": 0, "degree": 4, "threshold": 3}, "bits"),
        ({"bits": 65, "degree": 4, "threshold": 3}, "bits"),
        ({"bits": 32, "degree": 4, "threshold": 0}, "threshold"),
        ({"bits": 32, "degree": 4, "threshold": 6}, "threshold"),
        ({"bits": 32, "degree": 0, "threshold": 1}, "degree"),
    ],
)
def test_params_validation_names_field(kwargs, name):
    with pytest.raises(SecAggError, match=name) as err:
        SecAggParams(**kwargs)
    assert err.value.field == name


@pytest.mark.parametrize(
    "args, name",
    [
        ((10, 0), "bits"),
        ((10, 65), "bits"),
        ((10, 32, 4, 0), "threshold"),
        ((10, 32, 4, 6), "threshold"),
        ((10, 32, 10), "degree"),
        ((9, 32, 3), "degree"),  # 9 * 3 odd: no regular graph
        ((10, 32, 1), "degree"),  # 1-regular on 10 nodes: disconnected
        ((1, 32), "n_nodes"),
    ],
)
def test_plan_params_validation_names_field(args, name):
    with pytest.raises(SecAggError, match=name) as err:
        plan_params(*args)
    assert err.value.field == name


def test_input_validation():
    run = setup(6, 16, degree=5)
    do_share(run, b"x")
    u = 10
    for bad in (np.zeros(4, np.int64), np.zeros((2, 2), np.uint64),
                np.array([0, 2**16], dtype=np.uint64), [0, 1]):
        with pytest.raises(SecAggError) as err:
            run.nodes[u].mask(b"x", bad, *run.routed[u])
        assert err.value.field == "x"
    with pytest.raises(SecAggError, match="seed"):
        neighbour_graph(range(4), 2, b"short")
    with pytest.raises(SecAggError, match="release"):
        expand_mask(bytes(32), b"", 4, 8)


# ------------------------------------------------------------------------------ persistence


def test_a_node_restored_from_its_exported_state_between_every_round_sums_exactly():
    """A Flower SuperNode runs each message in a new process: the node's state travels through
    ``context.state`` as bytes. Export and restore every node before each round; the sum is still
    exact, a used label is still refused, and the refusal rules survive the round trip."""
    run = setup(12, 40)
    xs = random_inputs(run.nodes, 64, 40, seed=5)

    def cycle():
        run.nodes = {i: SecAggNode.restore(i, node.export_state()) for i, node in run.nodes.items()}

    cycle()
    do_share(run, b"persist", skip=(13,))
    cycle()
    do_mask(run, b"persist", xs, skip=(14,))
    cycle()
    total = do_unmask(run, b"persist")
    survivors = sorted(run.masked)
    np.testing.assert_array_equal(total, exact_sum(xs, survivors, 40))
    cycle()
    node = run.nodes[10]
    with pytest.raises(SecAggError):
        node.share(b"persist", run.params, run.server.channel_keys_for(10, run.channel_keys))
    alive, gone = run.server.unmask_request(run.shares, run.masked)
    v = next(u for u in run.server.graph[10] if u in alive)  # a neighbour whose self share node 10 revealed
    with pytest.raises(SecAggError, match="other share"):
        node.unmask(b"persist", [u for u in alive if u != v], [*gone, v])
    with pytest.raises(SecAggError, match="belongs to node"):
        SecAggNode.restore(99, node.export_state())
    with pytest.raises(SecAggError, match="malformed"):
        SecAggNode.restore(10, b"{not json")


def test_three_nodes_survive_one_dropout_because_each_node_holds_a_share_of_its_own_secrets():
    """With 3 nodes (degree 2, threshold 2 of 3 holders) a node lost after sharing is recovered:
    each survivor's self-mask seed comes from its own share and its live neighbour's; the lost
    node's mask key from the two survivors. Neither survivor can be made to give both secrets."""
    run = setup(3, 32)
    assert (run.params.degree, run.params.threshold) == (2, 2)
    ids = list(run.nodes)
    xs = random_inputs(ids, 50, 32, seed=9)
    total = full_release(run, b"three", xs, drop_mask=[ids[2]])
    np.testing.assert_array_equal(total, exact_sum(xs, ids[:2], 32))
    # the node that holds its own share still refuses to reveal its own mask key
    with pytest.raises(SecAggError, match="itself"):
        run.nodes[ids[0]].unmask(b"three", [ids[1]], [ids[0], ids[2]])
