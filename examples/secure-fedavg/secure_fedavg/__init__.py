"""A small Flower app: FedAvg of a torch logistic-regression model, with secure summation of
clipped, distributedly noised updates (fedpriv.flower.secure_strategy)."""
