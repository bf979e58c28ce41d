"""From a pandas DataFrame to a private model to one user's recommendations.

    python examples/python-api/dataframe_to_recommendations.py [--ratings ratings.csv --items items.csv]

Without --ratings it builds a small synthetic table (user, item, rating) in memory, and its item
catalogue; with it, it reads your CSV (columns user,item,rating; ratings on a 1..5 scale) and
your item catalogue (--items: a file with a header line, then one item id per line: every item,
rated or not). A private algorithm needs the catalogue declared: taken from the ratings, it
would change when a user who is an item's only rater joins.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

import fedpriv


N_ITEMS = 150


def synthetic_table(n_users: int = 3000, n_items: int = N_ITEMS, seed: int = 0) -> pd.DataFrame:
    """Low-rank ratings on a 1..5 scale, about 30 per user (public synthetic data)."""
    rng = np.random.default_rng(seed)
    U, V = rng.normal(0, 0.7, size=(n_users, 3)), rng.normal(0, 0.7, size=(n_items, 3))
    rows = []
    for u in range(n_users):
        for i in rng.choice(n_items, 30, replace=False):
            rows.append((f"u{u}", f"item{i}", float(np.clip(np.rint(3 + U[u] @ V[i] + rng.normal(0, 0.5)), 1, 5))))
    return pd.DataFrame(rows, columns=["user", "item", "rating"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ratings", help="CSV with columns user,item,rating")
    p.add_argument("--items", help="the item catalogue: a header line, then one item id per line (needed with --ratings)")
    args = p.parse_args()
    if args.ratings and not args.items:
        p.error("--ratings needs --items: the private model's item catalogue is declared, never read off the ratings")
    df = pd.read_csv(args.ratings) if args.ratings else synthetic_table()
    # the item catalogue and the rating range are public: declared, never read off the data
    items = args.items if args.items else [f"item{i}" for i in range(N_ITEMS)]
    options = {"rating_range": (1, 5), "items": items}
    result = fedpriv.train("adadpals", df, epsilon=5.0, data_options=options)
    print(f"epsilon spent {result.epsilon:.3f} (dp-accounting, from {len(result.ledger)} ledger records)")
    # beside the private model: the private bias model and the non-private model, on the same split
    bias = fedpriv.train("bias", df, epsilon=5.0, data_options=options)
    exact = fedpriv.train("als", df, data_options=options)
    print(f"test RMSE: adadpals {result.metrics['test_rmse']:.3f} (rank {result.metrics['config']['rank']}), "
          f"private bias model {bias.metrics['test_rmse']:.3f}, non-private ALS {exact.metrics['test_rmse']:.3f}")

    result.save_model("example-model", overwrite=True)  # item embeddings, biases, popularity, mean, config, ledger: released values only
    model = fedpriv.load_model("example-model")

    # one user's own ratings, on their own device: the user vector is solved locally, no budget spent
    mine = df[df["user"] == df["user"].iloc[0]]
    # ranked by the released popularity and this user's predicted ratings (rating: clipped to 1..5)
    print(model.recommend(mine["item"].tolist(), mine["rating"].tolist(), k=5, as_frame=True).to_string(index=False))


if __name__ == "__main__":
    main()
