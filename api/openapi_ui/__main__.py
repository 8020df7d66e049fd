"""``python -m api.openapi_ui verify | refresh [NAME@VERSION ...]``: the vendored Swagger UI
and ReDoc files against their manifest, by the dashboard's vendoring tool."""

from api.dashboard.vendor import main
from api.openapi_ui import STATIC

if __name__ == "__main__":
    raise SystemExit(main(vendor=STATIC, prog="python -m api.openapi_ui"))
