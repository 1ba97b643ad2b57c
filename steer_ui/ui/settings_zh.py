"""Chinese labels and help for every method's generated Train settings (issue #36: the Chinese page showed them in
English), read from ``steer_ui/locales/zh-CN.json``; the English is each method's own settings (its SettingSpec),
which the CLI and the API show too."""
from __future__ import annotations

from . import i18n

# Latin words the Chinese help keeps as they are, besides the page's shared allowed list: the choice values a user
# picks (shown verbatim in the dropdowns), the template placeholders a user types, names of algorithms, optimisers,
# metrics and data sets, and the path of a document.
KEPT_LATIN: tuple[str, ...] = (
    # choice values
    "last", "all", "prompt", "generated", "yes", "tanh", "relu", "svd", "zero", "random", "sum", "max", "calibrated",
    "projection", "hinge", "answer",
    # template placeholders ({completion}, {prompt}, {question}, {answer})
    "completion", "question",
    # names
    "Adam", "AdamW", "Sinkhorn", "ROUGE", "TruthfulQA",
    # docs/tsv.md
    "docs", "tsv",
)

# "<method>.<setting>": (label, help), for every setting of every registered method but "layer"; the text lives in
# steer_ui/locales/zh-CN.json (namespace "method_settings"), the English with each method's own SettingSpec
ZH: dict[str, tuple[str, str]] = {key: (entry["label"], entry["help"])
                                  for key, entry in i18n.LOCALES["zh-CN"]["method_settings"].items()}
