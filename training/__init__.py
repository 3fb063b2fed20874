"""Training and evaluation of the InfoNet estimator (outside the installed package)."""
