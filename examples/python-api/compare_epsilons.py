"""Two algorithms at three epsilon values, beside the non-private model; one plot.

    python examples/python-api/compare_epsilons.py [--data SPEC] [--out compare.png]

Default data: a synthetic set shaped like a small MovieLens (800 users, 300 items, 40,000
ratings). Prints a table and writes a PNG of test RMSE against epsilon.
"""

from __future__ import annotations

import argparse

import fedpriv


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="synthetic-mf:users=800,items=300,ratings=40000,seed=1")
    p.add_argument("--out", default="compare.png")
    args = p.parse_args()
    data = fedpriv.load_data(args.data)  # load once, train many times

    epsilons = [1.0, 3.0, 10.0]
    curves = {}
    for algorithm in ("adadpals", "bias"):
        curves[algorithm] = [fedpriv.train(algorithm, data, epsilon=eps).metrics["test_rmse"] for eps in epsilons]
    baseline = fedpriv.train("als", data).metrics["test_rmse"]  # non-private: no budget spent

    print("epsilon   " + "  ".join(f"{a:>9}" for a in curves))
    for j, eps in enumerate(epsilons):
        print(f"{eps:7.1f}   " + "  ".join(f"{curves[a][j]:9.3f}" for a in curves))
    print(f"non-private ALS: {baseline:.3f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for algorithm, rmse in curves.items():
        ax.plot(epsilons, rmse, marker="o", label=algorithm)
    ax.axhline(baseline, color="grey", linestyle="--", label="als (non-private)")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon (delta = 1e-5)")
    ax.set_ylabel("test RMSE")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
