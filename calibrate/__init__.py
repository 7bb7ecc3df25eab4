"""Calibration: from passes timed on the real engine to the simulator's step-cost model.

`sweep` times the continuous engine's runner on chosen pass shapes (on a GPU); `fit` fits the
cost model of `sim.cost.CalibratedCost` to them and reports its error on shapes it was not fitted
on. Above both the engine and the simulator: it imports each."""
