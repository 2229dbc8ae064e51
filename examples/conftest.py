"""The example's tests: its settings before ``shop_automations`` is imported (the CRM's URL is
replaced per test by its stub's), and the throwaway PostgreSQL of ``autom.testing``."""

import os

os.environ.setdefault("SHOP_WEBHOOK_SECRET", "shop-test-secret")
os.environ.setdefault("CRM_URL", "http://127.0.0.1:9")  # nothing listens: each test brings its CRM stub
os.environ.setdefault("CRM_TOKEN", "crm-test-token")
os.environ.setdefault("MANAGER_CHAT_ID", "-100777")
