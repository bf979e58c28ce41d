"""The ServerApp: FedAvg whose training rounds go through fedpriv's secure summation with
distributed Skellam noise; the epsilon comes from the strategy's ledger (dp-accounting)."""

import json

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedpriv.flower.secure_strategy import SecureDPFedAvg
from secure_fedavg.task import model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rounds = int(cfg["num-server-rounds"])
    strategy = SecureDPFedAvg(
        clipping_norm=float(cfg["clipping-norm"]),
        epsilon=float(cfg["epsilon"]),
        delta=float(cfg["delta"]),
        num_rounds=rounds,
        dropout=float(cfg["dropout"]),
        fraction_evaluate=1.0,
    )
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model().state_dict()), num_rounds=rounds)
    last = max(result.evaluate_metrics_clientapp) if result.evaluate_metrics_clientapp else None
    print(json.dumps({
        "epsilon_spent": strategy.epsilon(),
        "delta": strategy.delta,
        "noise_multiplier": strategy.noise_multiplier,
        "rounds": rounds,
        "eval": dict(result.evaluate_metrics_clientapp[last]) if last is not None else None,
        "ledger": strategy.ledger.to_list(),
    }))
