"""A TensorBoard that cannot start (tests/stack/test_side_roles.py puts this first on the
TensorBoard task's PYTHONPATH): `python -m tensorboard.main` fails as a broken install does."""
