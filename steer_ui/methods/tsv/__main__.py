"""``python -m steer_ui.methods.tsv``: the old name of ``python -m steer_ui.tools.tsv_tables``, kept for one release."""
# This import of steer_ui.tools from inside steer_ui/ is the alias and the only exception to "the runtime never
# imports tools": delete this file in the next release.
from steer_ui.tools.tsv_tables import main

if __name__ == "__main__":
    raise SystemExit(main())
