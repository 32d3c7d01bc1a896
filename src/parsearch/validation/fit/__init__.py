"""The shipped fit: residual factors fitted to measured runs, and its out-of-sample accuracy.

:mod:`.calibration` fits an efficiency profile's residual factors, regularised toward
cited priors and inside cited ranges; :mod:`.factor_ties` ties factors that move together;
:mod:`.network_calibration` and :mod:`.joint_fit` add a cluster's delivered bandwidth;
:mod:`.cluster_speed` a cluster-wide speed factor; :mod:`.gemm_size_curve` fits GEMM
efficiency against problem size to a matmul sweep; :mod:`.crossval` reports leave-one-out
accuracy and error bands.
"""
