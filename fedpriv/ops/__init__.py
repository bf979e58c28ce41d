"""Operations: the ``flwr run`` app (flwr_app.py), the launcher of ``--engine flower``
(launcher.py), deployments over gRPC and Docker (deploy/), experiments (experiments/) and the
HTML report (report.py)."""
