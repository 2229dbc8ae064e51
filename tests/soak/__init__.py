"""The short soak (bench/soak.py) run as part of the suite."""
