"""Flower runtime: thin ClientApp / ServerApp over the algorithm functions of fedpriv."""
