"""The leads example's tests: its settings before ``leads_bot`` is imported (the model's URL is set
per test to its stub's), and this folder on the import path."""

import os

os.environ.setdefault("LEADS_FORM_SECRET", "leads-test-secret")
os.environ.setdefault("MANAGERS_CHAT_ID", "-100900")
os.environ.setdefault("MODEL_URL", "http://127.0.0.1:9")  # nothing listens: each test brings its model stub
os.environ.setdefault("REMIND_MINUTES", "0.005")  # 0.3 s: the tests run the reminder without waiting long

