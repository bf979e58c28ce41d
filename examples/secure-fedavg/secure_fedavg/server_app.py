"""The ServerApp: FedAvg whose training rounds go through fedpriv's secure summation with
distributed Skellam noise; the epsilon comes from the strategy's ledger (dp-accounting). It
prints one line per round (epsilon spent so far, the nodes' evaluation accuracy and loss) and a
short summary; ``out`` in the run config names a file for the whole result as JSON."""

import json
import time
from pathlib import Path

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from fedpriv.flower.secure_strategy import SecureDPFedAvg
from secure_fedavg.task import model

app = ServerApp()


def _line(text: str) -> None:
    print(f"[secure-fedavg] {text}", flush=True)


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
        evaluate_metrics=("eval-loss", "eval-acc"),  # evaluation: a secure sum of these (weighted by num-examples)
    )
    t0 = time.time()

    def progress(server_round, epsilon, metrics):
        shown = ""
        if metrics is not None:
            shown = f"  accuracy {metrics.get('eval-acc', float('nan')):.3f}  loss {metrics.get('eval-loss', float('nan')):.4f}"
        _line(f"round {server_round}/{rounds}  epsilon {epsilon:.3f} of {strategy.ledger.budget[0]:g}{shown}  ({time.time() - t0:.1f} s)")

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model().state_dict()), num_rounds=rounds, on_round=progress)
    last = max(result.evaluate_metrics_clientapp) if result.evaluate_metrics_clientapp else None
    final = dict(result.evaluate_metrics_clientapp[last]) if last is not None else {}
    _line("summary")
    _line(f"  rounds {rounds}, each a secure sum over the sampled nodes (SecAgg+, distributed Skellam noise)")
    _line(f"  privacy: epsilon {strategy.epsilon():.4f} spent of {cfg['epsilon']}, delta {strategy.delta:g} (dp-accounting from the ledger; unit: one node)")
    _line(f"  noise: multiplier {strategy.noise_multiplier:.3f} x clipping norm {strategy.clipping_norm:g} per round, shared among the nodes")
    if final:
        _line(f"  final evaluation: accuracy {final.get('eval-acc', float('nan')):.3f}, loss {final.get('eval-loss', float('nan')):.4f} (a secure sum over the nodes: exact, not noised)")
    out = str(cfg.get("out", "") or "")
    if out:
        # the ledger's sensitivities are in the secure sum's integer domain (the clipping norm times the quantization scale)
        Path(out).write_text(json.dumps({"epsilon_spent": strategy.epsilon(), "delta": strategy.delta, "noise_multiplier": strategy.noise_multiplier,
                                         "rounds": rounds, "eval": final, "ledger": strategy.ledger.to_list()}, indent=1))
        _line(f"  wrote {out}")
