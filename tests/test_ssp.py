"""Public-feature algorithms: encoder, SSP gradients, sensitivities, accounting, both engines."""

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import als_config, keyed_shard, adversarial_interactions
from fedpriv.algorithms import als, registry, ssp
from fedpriv.algorithms.encoder import FeatureTable, ItemEncoder, per_user_clipped_gradient
from fedpriv.algorithms.kernels import project_psd, solve_spd, upper
from fedpriv.privacy.randomness import RunSecrets
from fedpriv.data.interactions import Interactions
from fedpriv.errors import ConfigError
from fedpriv.privacy.accounting import epsilon_rdp
from fedpriv.privacy.ledger import PrivacyLedger


def _state(algorithm, inter, cfg, features):
    st_ = als.PublicState(algorithm=algorithm, config=cfg, n_items=inter.n_items, n_users=inter.n_users, rating_range=(1.0, 5.0))
    st_.mean = 3.0
    st_.counts_hat = inter.item_counts().astype(float) + 3.0
    st_.multipliers = {n: 1.0 for n in ("item_stats_A", "item_stats_b", "item_stats_H", "item_stats_g", "encoder_grad")}
    server = ssp.init_server(st_, features) if registry.get(algorithm).encoder else None
    als.server_weights(st_)
    return st_, server


def test_feature_table_pads_bags_and_rejects_unknown_fields(small_mf):
    feats = small_mf.item_features
    table = FeatureTable.build(feats, feats.n_items, ["genre", "year", "id"])
    genre = table.index[0].numpy()
    for i in (0, 5, 17):
        active = sorted(feats.item_field_ids("genre")[i])
        assert sorted(genre[i][genre[i] < table.vocab[0]]) == active
    assert table.vocab[2] == feats.n_items
    with pytest.raises(ConfigError, match="unknown feature field 'cast'"):
        FeatureTable.build(feats, feats.n_items, ["genre", "cast"])
    with pytest.raises(ConfigError, match="no public item features"):
        FeatureTable.build(None, 10, ["genre"])


def test_encoder_gradient_from_noised_statistics_touches_only_active_feature_rows(small_mf):
    """Noise is on the statistics, not on the gradient: the gradient of a mini-batch of items
    is zero on every embedding row whose feature no item of the batch has."""
    cfg = als_config("am-ssp", rank=3, features="genre,year,id")
    inter = small_mf.interactions
    state, server = _state("am-ssp", inter, cfg, small_mf.item_features)
    parts = als.client_item_stats(keyed_shard(inter), state)
    A, b, _ = als.sum_item_stats([parts], inter.n_items, 4)
    A, b, _ = als.release_item_stats(A, b, None, state, PrivacyLedger(seed=1))
    batch = torch.tensor([3, 40, 77])
    enc = server.encoder
    E = enc(batch)
    loss = ssp.ssp_objective(E, torch.from_numpy(project_psd(A))[batch], torch.from_numpy(b.astype(np.float32))[batch], 1.0)
    loss.backward()
    for emb, active, v in zip(enc.embeddings, enc.table.active(batch.numpy()), enc.table.vocab):
        touched = np.flatnonzero(emb.grad.abs().sum(1).numpy() > 0)
        assert set(touched) <= set(active.tolist()) and len(touched) > 0
        assert len(touched) < v  # sparse: most rows untouched
    assert np.isfinite(A).all() and A.std() > 0  # the statistics really were noised


def test_full_batch_sparse_pooling_equals_the_gathered_encoder(small_mf):
    """The server's full-batch steps pool with one sparse product per field; outputs and
    parameter gradients equal the per-item gather path (used for mini-batches and per-user
    gradients), with multi-valued fields, items without a feature and the pad row kept at zero."""
    feats = small_mf.item_features
    table = FeatureTable.build(feats, feats.n_items, ["genre", "year", "id"])
    enc = ItemEncoder(table, out_dim=4, hidden=5, seed=3)
    every = torch.arange(feats.n_items)
    g = torch.randn(feats.n_items, 4, generator=torch.Generator().manual_seed(0))
    grads = []
    for items in (None, every):
        enc.zero_grad()
        out = enc(items)
        (out * g).sum().backward()
        grads.append((out.detach(), [p.grad.clone() for p in enc.parameters()]))
    (o1, g1), (o2, g2) = grads
    assert torch.allclose(o1, o2, atol=1e-6)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-5 * max(1.0, b.abs().max().item()))
    for emb, v in zip(enc.embeddings, table.vocab):
        assert emb.grad[v].abs().max() == 0  # the pad row gets no gradient on either path


def test_id_only_encoder_reaches_the_item_solve():
    """With the item id as the only field, SSP's encoder steps minimise the same quadratic as
    the ALS item solve: they converge to (PSD(A) + reg I)^-1 b."""
    rng = np.random.default_rng(0)
    n, d = 25, 3
    X = rng.normal(size=(n, 6, d))
    A = np.einsum("nki,nkj->nij", X, X) + rng.normal(scale=0.3, size=(n, d, d))
    A = 0.5 * (A + A.transpose(0, 2, 1))
    b = rng.normal(size=(n, d))
    cfg = als_config("am-ssp", rank=2, item_bias=True, features="id", ssp_steps=3000, ssp_lr=0.01, reg_item_private=1.0)
    state = als.PublicState(algorithm="am-ssp", config=cfg, n_items=n, n_users=100, rating_range=(1.0, 5.0))
    server = ssp.init_server(state, None)
    server.ssp_update([(A, b, None)])
    want = solve_spd(project_psd(A), b, 1.0)
    got = server.encoder.outputs()
    assert np.allclose(got, want, atol=5e-3 * np.abs(want).max())
    # the published state is the encoder output (bias coordinate times kappa)
    assert np.allclose(state.item_factors, got[:, :2], atol=1e-6)
    assert np.allclose(state.item_bias, got[:, 2] * als.bias_coordinate(state))


def test_per_user_clipped_gradient_matches_a_loop(small_mf):
    table = FeatureTable.build(small_mf.item_features, small_mf.item_features.n_items, ["genre", "year", "id"])
    enc = ItemEncoder(table, out_dim=4, hidden=3, seed=2)
    rng = np.random.default_rng(1)
    n_users, L = 7, 5
    items = rng.integers(0, table.n_items, size=(n_users, L))
    items[2, 3:] = -1  # padding
    g = rng.normal(size=(n_users, L, 4)).astype(np.float32)
    g[items < 0] = 0.0
    total, norms = per_user_clipped_gradient(enc, items, g, clip=0.5, chunk_entries=10)
    want = np.zeros_like(total)
    for u in range(n_users):
        enc.zero_grad()
        keep = items[u] >= 0
        (enc(torch.from_numpy(items[u][keep])) * torch.from_numpy(g[u][keep])).sum().backward()
        flat = torch.cat([p.grad.reshape(-1) for p in enc.parameters()]).double().numpy()
        assert np.linalg.norm(flat) == pytest.approx(norms[u], rel=1e-4)
        want += flat * min(1.0, 0.5 / np.linalg.norm(flat))
    assert np.allclose(total, want, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(n_ratings=st.sampled_from([0, 1, 3, 100]), rating=st.sampled_from([1.0, 5.0, 1e6, -1e6]), seed=st.integers(0, 10_000))
def test_one_user_moves_the_convex_statistics_by_at_most_their_sensitivity(n_ratings, rating, seed):
    from fedpriv.data.synthetic import make_mf

    inter = adversarial_interactions(np.random.default_rng(seed), 20, 120, 600, n_ratings, rating)
    feats = make_mf(20, inter.n_items, 600, seed=1).item_features
    cfg = als_config("am-ssp-convex", rank=3, user_clip=1.5, beta=2.0, features="genre,year")
    state, _ = _state("am-ssp-convex", inter, cfg, feats)
    state.item_factors = state.item_factors * 30  # large embeddings: users hit the clip
    full = ssp.client_convex_stats(keyed_shard(inter), state)
    without = ssp.client_convex_stats(keyed_shard(inter.subset(inter.users != inter.n_users - 1)), state)
    H1, g1, _ = als.sum_item_stats([full], inter.n_items, 4)
    H0, g0, _ = als.sum_item_stats([without], inter.n_items, 4)
    assert np.linalg.norm(upper(H1) - upper(H0)) <= als.sensitivity("item_stats_H", cfg, (1, 5)) * (1 + 1e-5)
    assert np.linalg.norm(g1 - g0) <= als.sensitivity("item_stats_g", cfg, (1, 5)) * (1 + 1e-5)


@settings(max_examples=8, deadline=None)
@given(n_ratings=st.sampled_from([1, 3, 100]), rating=st.sampled_from([1.0, 5.0, 1e6]), seed=st.integers(0, 1000))
def test_am_dpsgd_user_gradient_is_clipped(n_ratings, rating, seed):
    from fedpriv.algorithms import protocol
    from fedpriv.data.synthetic import make_mf

    rng = np.random.default_rng(seed)
    items = rng.choice(120, size=n_ratings, replace=False)
    inter = Interactions(np.zeros(n_ratings, int), items, np.full(n_ratings, rating), 1, 120)
    feats = make_mf(20, 120, 600, seed=1).item_features
    cfg = als_config("am-dpsgd", rank=3, sgd_clip=0.7, sgd_sampling_rate=1.0, features="genre,year,id")
    state, server = _state("am-dpsgd", inter, cfg, feats)
    g = protocol.client_step(keyed_shard(inter), state, 0, server.encoder.table)
    assert g.shape == (server.encoder.n_params(),) and 0 < np.linalg.norm(g) <= 0.7 * (1 + 1e-6)


@pytest.mark.parametrize("algorithm,resamples,count", [("am-ssp", 0, 2), ("am-ssp1", 0, 2 * 6), ("am-ssp1", 3, 2 * 3)])
def test_ssp_resampling_is_accounted_per_draw(small_mf, algorithm, resamples, count):
    from fedpriv.engine.inprocess import train_inprocess

    cfg = als_config(algorithm, rank=2, steps=2, ssp_steps=6, ssp_resamples=resamples)
    res = train_inprocess(algorithm, small_mf.interactions, cfg, rating_range=(1, 5), epsilon=3.0, item_features=small_mf.item_features, progress=False)
    counts = {r.name: r.count for r in res.ledger.releases}
    assert counts["item_stats_A"] == counts["item_stats_b"] == count
    assert epsilon_rdp(res.ledger, 1e-5) == pytest.approx(3.0, rel=1e-3)


def test_am_ssp_learns_from_public_features():
    """On data whose item factors are a function of the public features, AM-SSP at a moderate
    epsilon beats the item-mean baseline and the id-only AdaDPALS model of the same budget."""
    from fedpriv.data.spec import DataSpec
    from fedpriv.data.synthetic import make_mf
    from fedpriv.run import run

    syn = make_mf(600, 400, 24000, seed=11)
    from fedpriv.data.loaders import Dataset

    ds = Dataset(syn.interactions, syn.item_features, (1.0, 5.0), False, "synthetic", 0)
    spec = DataSpec("synthetic-mf", {"users": "600"})
    out = {}
    for alg in ("adadpals", "am-ssp"):
        over = {"rank": "3", "steps": "2", **({"ssp_steps": "100"} if alg == "am-ssp" else {})}
        m, _ = run(alg, spec, epsilon=1.0, overrides=over, dataset=ds, progress=False, noise_seed=11)  # reproducible: a utility bar
        out[alg] = m["test_rmse"]
    assert out["am-ssp"] < out["adadpals"], out


def test_convex_run_reports_logistic_metrics(small_mf, tmp_path):
    from fedpriv.data.loaders import Dataset
    from fedpriv.data.spec import DataSpec
    from fedpriv.run import run

    ds = Dataset(small_mf.interactions, small_mf.item_features, (1.0, 5.0), False, "synthetic", 0)
    m, ledger = run("am-ssp-convex", DataSpec("synthetic-mf", {}), epsilon=2.0, overrides={"rank": "2", "steps": "2", "ssp_steps": "30"}, dataset=ds, progress=False)
    assert 0 < m["test_logloss"] < 0.75 and 0.5 < m["test_accuracy"] <= 1
    assert "mean" not in {r["name"] for r in ledger} and {"item_stats_H", "item_stats_g", "counts"} <= {r["name"] for r in ledger}
    assert m["epsilon_spent"] == pytest.approx(2.0, rel=1e-3)
    json.dumps(m, allow_nan=False)


def test_cli_runs_am_ssp_and_names_a_bad_feature_field(tmp_path, capsys):
    from fedpriv.cli import main

    data = "synthetic-mf:users=80,items=40,ratings=2000,seed=2"
    assert main(["run", "am-ssp", "--data", data, "--epsilon", "2", "--set", "steps=1", "--set", "ssp_steps=10", "--out", str(tmp_path / "ok"), "--quiet"]) == 0
    m = json.loads((tmp_path / "ok" / "metrics.json").read_text())
    assert m["algorithm"] == "am-ssp" and m["test_rmse"] > 0
    assert main(["run", "am-ssp", "--data", data, "--epsilon", "2", "--set", "features=genre,cast", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert "features" in capsys.readouterr().err and not (tmp_path / "bad").exists()


@pytest.mark.flower  # Flower's engine: scripts/test.sh runs it on the newest Flower
@pytest.mark.parametrize("algorithm", ["am-dpsgd", "am-ssp-convex"])
def test_flower_and_inprocess_agree_for_encoder_algorithms(tmp_path, algorithm):
    from fedpriv.data.splits import random_split
    from fedpriv.data.synthetic import make_mf
    from fedpriv.engine.inprocess import train_inprocess
    from fedpriv.flower.server_app import FlowerJob
    from fedpriv.flower.simulation import simulate

    syn = make_mf(200, 60, 5000, seed=4)
    split = random_split(syn.interactions, seed=1234)
    cfg = als_config(algorithm, rank=3, steps=2, sgd_sampling_rate=0.5, ssp_steps=20, features="genre,year,id")
    job = FlowerJob(algorithm, 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), tmp_path, users_per_node=10, item_features=syn.item_features, secrets=RunSecrets(31))
    res = simulate(job, num_nodes=20)
    ref = train_inprocess(algorithm, split.train, cfg, rating_range=(1.0, 5.0), epsilon=4.0, users_per_shard=10, item_features=syn.item_features, progress=False, secrets=RunSecrets(31))
    assert np.allclose(res.state.item_factors, ref.state.item_factors, rtol=1e-4, atol=1e-5)
    assert res.ledger.to_list() == ref.ledger.to_list() and res.rejected == []
    if algorithm == "am-ssp-convex":
        from fedpriv.algorithms.evaluation import evaluate_logistic

        loss, acc, _ = evaluate_logistic(ref.state, split.train, split.test, split.train.item_counts())
        assert res.logistic["test"]["logloss"] == pytest.approx(loss, rel=1e-6) and res.logistic["test"]["accuracy"] == pytest.approx(acc)


def test_ssp_gradient_decomposition_equals_autograd_on_the_full_loss(small_mf):
    """Proposition 1: the gradient of sum_(u,j) w/2 (u.e_j(theta) - y)^2 + reg/2 sum_j |e_j|^2
    with respect to the encoder parameters equals sum_j J_j^T (A_j e_j - b_j + reg e_j) with the
    sufficient statistics A_j = sum w u u^T, b_j = sum w y u."""
    feats = small_mf.item_features
    table = FeatureTable.build(feats, feats.n_items, ["genre", "year", "id"])
    enc = ItemEncoder(table, out_dim=4, hidden=3, seed=5).double()
    rng = np.random.default_rng(2)
    n_pairs, n_items, reg = 3000, feats.n_items, 0.7
    U = torch.from_numpy(rng.uniform(-1, 1, size=(n_pairs, 4)))
    items = torch.from_numpy(rng.integers(0, n_items, n_pairs))
    y = torch.from_numpy(rng.uniform(-2, 2, n_pairs))
    w = torch.from_numpy(rng.uniform(0, 1, n_pairs))
    params = list(enc.parameters())

    E = enc()
    full = 0.5 * (w * ((U * E[items]).sum(1) - y) ** 2).sum() + 0.5 * reg * (E * E).sum()
    g_full = torch.autograd.grad(full, params)

    A = torch.zeros(n_items, 4, 4, dtype=torch.float64).index_add_(0, items, w[:, None, None] * U[:, :, None] * U[:, None, :])
    b = torch.zeros(n_items, 4, dtype=torch.float64).index_add_(0, items, (w * y)[:, None] * U)
    E = enc()
    g_ssp = torch.autograd.grad(ssp.ssp_objective(E, A, b, reg), params)
    E = enc()
    resid = torch.einsum("nij,nj->ni", A, E) - b + reg * E  # A_j e_j - b_j + reg e_j
    g_vjp = torch.autograd.grad(E, params, grad_outputs=resid.detach())
    for a, s_, v in zip(g_full, g_ssp, g_vjp):
        assert torch.allclose(a, s_, rtol=1e-9, atol=1e-9) and torch.allclose(a, v, rtol=1e-9, atol=1e-9)
    assert sum(float(a.abs().sum()) for a in g_full) > 0


def test_ssp_convex_on_a_quadratic_loss_equals_ssp2(small_mf):
    """For the squared loss the convex statistics are H_j = A_j and g_j = A_j e0_j - b_j at the
    current outputs e0: the convex update's model equals the SSP2 objective up to a constant,
    so both servers follow the same trajectory."""
    values = dict(rank=3, features="genre,year,id", ssp_steps=60, ssp_lr=0.05, reg_item_private=0.5)
    inter = small_mf.interactions
    servers = []
    for algorithm in ("am-ssp", "am-ssp-convex"):
        state, server = _state(algorithm, inter, als_config(algorithm, **values), small_mf.item_features)
        servers.append((state, server))
    (s1, ssp2), (s2, convex) = servers
    assert np.array_equal(ssp2.encoder.outputs(), convex.encoder.outputs())  # same public init
    A, b, _ = als.sum_item_stats([als.client_item_stats(keyed_shard(inter), s1)], inter.n_items, 4)
    A, b, _ = als.release_item_stats(A, b, None, s1, PrivacyLedger(seed=3))  # noised: PSD projection matters
    ssp2.ssp_update([(A, b, None)])
    E0 = ssp.item_outputs(s2)
    P = project_psd(A).astype(np.float64)
    convex.convex_update(A, np.einsum("nij,nj->ni", P, E0) - b)
    got, want = convex.encoder.outputs(), ssp2.encoder.outputs()
    assert np.abs(want - E0).max() > 1e-2  # the update moved the encoder
    assert np.allclose(got, want, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("algorithm", ["am-ssp", "am-ssp1", "am-ssp-convex", "am-dpsgd"])
def test_each_variant_is_accounted_like_its_closed_form(small_mf, algorithm):
    """The ledger of each variant holds its planned releases; unsampled variants compose to the
    closed-form Gaussian epsilon (rho = sum count / 2 z^2), and AM-DPSGD's sampled rounds cost
    less than the same rounds unsampled."""
    from fedpriv.engine.inprocess import train_inprocess
    from fedpriv.privacy.accounting import gaussian_epsilon_closed_form, zcdp_rho
    from fedpriv.privacy.ledger import Release

    cfg = als_config(algorithm, rank=2, steps=3, ssp_steps=4, sgd_sampling_rate=0.2)
    res = train_inprocess(algorithm, small_mf.interactions, cfg, rating_range=(1, 5), epsilon=2.0, item_features=small_mf.item_features, progress=False)
    planned = {p.name: p.count for p in als.plan_releases(algorithm, cfg, implicit=False)}
    assert {r.name: r.count for r in res.ledger.releases} == planned
    eps = epsilon_rdp(res.ledger, 1e-5)
    assert eps == pytest.approx(2.0, rel=1e-3)
    if algorithm != "am-dpsgd":
        rho = sum(r.count / (2 * r.noise_multiplier**2) for r in res.ledger.releases)
        assert rho == pytest.approx(zcdp_rho(res.ledger))
        assert gaussian_epsilon_closed_form(rho, 1e-5) == pytest.approx(eps, rel=1e-3)
    else:
        unsampled = [Release(r.name, r.mechanism, r.sensitivity, r.noise_std, r.count, None, r.dim) for r in res.ledger.releases]
        assert epsilon_rdp(unsampled, 1e-5) > 1.5 * eps
