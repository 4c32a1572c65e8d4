"""`hydra/sweeper=volt_optuna`: volt's Optuna search (the work is in `volt.sweeps.search`)."""
