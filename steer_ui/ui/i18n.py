"""English and Simplified Chinese text for the whole app (the English server messages come from
:mod:`steer_ui.messages`, which the core uses; this module is the UI's).

Two kinds of text:

* **Labels** (``TRANSLATIONS``): component labels, buttons, tab names and
  static Markdown.  The UI passes ``gr.I18n`` keys, so the *browser*
  translates them: it picks the language from ``navigator.language``, and the
  header's language switch (or gradio's own footer Settings → Language)
  changes it on the fly without a round trip.
* **Messages** (``MESSAGES``) and chart text (``PLOTS``): made on the server
  (errors, status lines, plot titles) in the session's language, which the
  switch also sends to the server (:meth:`Service.set_language`).

Numbers and token strings are inserted as they are, never translated.

To add text (e.g. the Concepts tab): call :func:`extend` at import time of
your module, before the app is built, with the same keys in both languages::

    from steer_ui.ui import i18n
    i18n.extend(labels={"en": {"concepts.title": "..."}, "zh-CN": {"concepts.title": "..."}},
                messages={"en": {...}, "zh-CN": {...}})

``tests/unit/test_backend_i18n.py`` fails when a key is missing in one
language or a message's ``{placeholders}`` differ between them.
"""
from __future__ import annotations

import re
import string
from typing import Any

from ..messages import ENGLISH, FIELDS, field_name, normalise_lang

LANGS = ("en", "zh-CN")

TRANSLATIONS: dict[str, dict[str, str]] = {
    "en": {
        "app.title": "# steer_ui: activation steering, live",
        "app.subtitle": "Pick a vector and a layer, drag α, and watch the next-token distribution, the logits and "
                        "both generations change. Everything runs on the loaded model.",
        "app.language": "Language",
        "tab.model": "Model",
        "tab.data": "Data",
        "tab.train": "Train",
        "tab.explore": "Explore",
        "tab.concepts": "Concepts",
        "tab.compare": "Many prompts",
        "compare.intro": "Does the vector steer, or did one prompt get lucky? Runs the **vector, layer and α chosen on "
                         "Explore** over many prompts at once (one batched decode). With a pairs dataset (prompt, "
                         "positive, negative) it measures the behaviour itself: each held-out prompt's margin "
                         "log p(positive) − log p(negative) over α, and its steerability (the slope of that margin).",
        "compare.prompts": "Prompts, one per line (up to 64)",
        "compare.use_dataset": "Use the loaded dataset's held-out pairs instead",
        "compare.use_dataset_info": "margins and steerability need pairs: e.g. the bundled sentiment_pairs.csv",
        "compare.max_tokens": "New tokens per generation",
        "compare.run": "Compare",
        "compare.empty": "Paste prompts or use a pairs dataset, then Compare.",
        "compare.curves": "Margin over α",
        "compare.histogram": "Steerability",
        "compare.table": "Per prompt",
        "compare.save": "Save result",
        "compare.link": "Link to this comparison",
        "tab.detect": "Detect",
        "tab.export": "Export / Import",
        # model
        "model.source": "Model",
        "model.source_info": "the models this server offers (the administrator lists them with --model-choices; "
                             "switching needs --allow-model-switch)",
        "model.device": "Device",
        "model.dtype": "Dtype",
        "model.load": "Load model",
        "model.norms": "Residual norm per layer",
        "model.facts": "Architecture facts",
        # data
        "data.file": "Upload a dataset (CSV, TSV, JSON, JSONL, Parquet)",
        "data.bundled": "Bundled dataset",
        "data.schema": "Schema",
        "data.schema_info": "auto detects it from the column names",
        "data.use_bundled": "Use bundled dataset",
        "data.empty": "No dataset yet: upload one or pick a bundled one.",
        "data.preview": "Preview (first rows)",
        "data.balance": "Class balance (train / test split by group)",
        "data.details": "Details",
        # train
        "explore.extend": "Extend range",
        "explore.extend_info": "show 5× the calibrated range, up to where the text breaks down",
        "explore.copy_link": "Copy link",
        "explore.link": "Link to this view",
        "train.cancel": "Cancel",
        "train.method": "Method",
        "train.method_info": "mean-diff, probe, PCA and ITI need labels or pairs; TSV labelled answers; L2S pairs",
        "train.auto_layer": "Automatic layer",
        "train.layer": "Layer",
        "train.position": "Token position",
        "train.seed": "Seed",
        "train.exemplars": "Labelled exemplars",
        "train.epochs": "Epochs",
        "train.logit_penalty": "Logit penalty",
        "train.kl_penalty": "KL penalty",
        "train.top_heads": "Top heads",
        "train.context_layer": "Context layer L′ (empty = L*)",
        "train.hidden": "MLP hidden size (empty = default)",
        "train.advanced": "Advanced settings",
        "train.placeholder_default": "empty: the method's default",
        "train.placeholder_floats": "e.g. 6, 20",
        "train.probe": "Probe every layer",
        "train.train": "Train",
        "train.empty": "Load a dataset in the Data tab, then train.",
        "train.probe_chart": "Per-layer probe AUROC (held-out)",
        "train.curves": "Training curves",
        "train.results": "Results",
        "train.report": "Full report",
        "train.probe_table": "Per-layer probe table",
        # explore
        "explore.prompt": "Prompt",
        "explore.vector": "Steering vector",
        "explore.vector_info": "your trained or imported vectors, or a seeded random direction",
        "explore.layer": "Layer",
        "explore.random_seed": "Random seed",
        "explore.relative": "Relative units",
        "explore.relative_info": "α = 1 adds a vector as long as a typical residual at this layer",
        "explore.alpha_max": "α range",
        "explore.alpha": "α (steering strength)",
        "explore.alpha_info": "drag: next-token bars update live; release: both sides regenerate",
        "explore.sampling": "Sampling",
        "explore.greedy": "Greedy",
        "explore.temperature": "Temperature",
        "explore.top_k": "Top-k (0 = off)",
        "explore.top_p": "Top-p",
        "explore.repetition": "Repetition penalty",
        "explore.max_tokens": "Max new tokens",
        "explore.seed": "Sampling seed",
        "explore.delta_limit": "Δlogit limit (empty = the vector's own, 0 = off)",
        "explore.delta_limit_info": "the most any token's logit may move against the unsteered model on the same text, "
                                    "at each steered step (centred); a step that goes over keeps that share of its "
                                    "change. Left empty, a vector that states a bound (a constrained TSV vector) "
                                    "steers within it: its calibration holds it on training text only, this holds "
                                    "it at every step",
        "explore.generate": "Generate",
        "explore.sweep": "Dose-response sweep",
        "explore.target": "Target token (optional)",
        "explore.target_info": "its probability is tracked in the dose-response chart",
        "explore.readout_empty": "Drag α to see KL, entropy and max |Δlogit|.",
        "explore.bars": "Next-token probabilities",
        "explore.delta": "Δlogit over the vocabulary",
        "explore.whole_vocabulary": "Whole vocabulary",
        "explore.share": "Share",
        "explore.save_result": "Save result",
        "explore.run_live": "Run live",
        "explore.unsteered": "Unsteered",
        "explore.steered": "Steered (each token's Δlogit: red = promoted, purple = suppressed)",
        "explore.token_hint": "Click a steered token to see its log-probability, Δlogit and the top alternatives.",
        "explore.per_token": "Per-token Δlogit",
        "explore.dose": "Dose-response",
        "explore.raw": "Raw numbers",
        "explore.tokens": "Tokens / sweep table",
        "explore.details": "JSON",
        # detect
        "detect.vector": "TSV vector",
        "detect.vector_info": "train one with method TSV, or import one",
        "detect.answers": "Answers to score (prompt, answer)",
        "detect.from_explore": "Use the last Explore generation",
        "detect.file": "Or a labelled file (gives AUROC)",
        "detect.run": "Score",
        "detect.empty": "Pick a TSV vector and type answers or upload a labelled file.",
        "detect.scores": "p(truthful) per answer",
        "detect.histogram": "Score distribution",
        "detect.details": "JSON",
        # export / import
        "export.export_title": "### Export",
        "export.vector": "Vector",
        "export.format": "Format",
        "export.format_info": "native keeps everything (TSV prototypes, L2S MLP); gguf loads in llama.cpp / repeng",
        "export.export": "Export",
        "export.files": "Files",
        "export.import_title": "### Import",
        "export.upload": "Upload a vector file (any supported format)",
        "export.info": "Vector metadata",
    },
    "zh-CN": {
        "app.title": "# steer_ui：激活引导，实时可见",
        "app.subtitle": "选择一个向量和一层，拖动 α，观察下一个词元的分布、logits 以及两侧生成结果如何变化。所有计算都在已加载的模型上进行。",
        "app.language": "语言",
        "tab.model": "模型",
        "tab.data": "数据",
        "tab.train": "训练",
        "tab.explore": "探索",
        "tab.concepts": "概念",
        "tab.compare": "多个提示",
        "compare.intro": "向量真的能引导，还是某个提示碰巧有效？用**探索页上选定的向量、层和 α** 同时运行多个提示"
                         "（一次批量解码）。使用成对数据集（提示、正例、反例）时直接度量行为：每个留出提示的间隔 "
                         "log p(正例) − log p(反例) 随 α 的变化，以及其可引导性（该间隔的斜率）。",
        "compare.prompts": "提示，每行一个（最多 64 个）",
        "compare.use_dataset": "改用已加载数据集的留出对",
        "compare.use_dataset_info": "间隔和可引导性需要成对数据：例如自带的 sentiment_pairs.csv",
        "compare.max_tokens": "每次生成的新词元数",
        "compare.run": "比较",
        "compare.empty": "粘贴提示或使用成对数据集，然后点击比较。",
        "compare.curves": "间隔随 α 的变化",
        "compare.histogram": "可引导性",
        "compare.table": "逐提示",
        "compare.save": "保存结果",
        "compare.link": "此比较的链接",
        "tab.detect": "检测",
        "tab.export": "导出 / 导入",
        "model.source": "模型",
        "model.source_info": "此服务器提供的模型（管理员用 --model-choices 列出；切换需要 --allow-model-switch）",
        "model.device": "设备",
        "model.dtype": "数据类型",
        "model.load": "加载模型",
        "model.norms": "各层残差范数",
        "model.facts": "架构信息",
        "data.file": "上传数据集（CSV、TSV、JSON、JSONL、Parquet）",
        "data.bundled": "内置数据集",
        "data.schema": "数据格式",
        "data.schema_info": "auto 表示根据列名自动识别",
        "data.use_bundled": "使用内置数据集",
        "data.empty": "还没有数据集：请上传一个或选择内置数据集。",
        "data.preview": "预览（前几行）",
        "data.balance": "类别分布（按分组划分训练 / 测试）",
        "data.details": "详细信息",
        "explore.extend": "扩大范围",
        "explore.extend_info": "显示校准范围的 5 倍，直到文本崩溃",
        "explore.copy_link": "复制链接",
        "explore.link": "此视图的链接",
        "train.cancel": "取消",
        "train.method": "方法",
        "train.method_info": "mean-diff、probe、PCA 和 ITI 需要标签或成对数据；TSV 需要带标签的回答；L2S 需要成对数据",
        "train.auto_layer": "自动选择层",
        "train.layer": "层",
        "train.position": "词元位置",
        "train.seed": "随机种子",
        "train.exemplars": "带标签示例数",
        "train.epochs": "训练轮数",
        "train.logit_penalty": "Logit 惩罚",
        "train.kl_penalty": "KL 惩罚",
        "train.top_heads": "选用的注意力头数",
        "train.context_layer": "上下文层 L′（留空 = L*）",
        "train.hidden": "MLP 隐藏层大小（留空 = 默认）",
        "train.advanced": "高级设置",
        "train.placeholder_default": "留空：使用该方法的默认值",
        "train.placeholder_floats": "例如 6, 20",
        "train.probe": "逐层探测",
        "train.train": "训练",
        "train.empty": "先在“数据”页加载数据集，然后训练。",
        "train.probe_chart": "逐层探针 AUROC（留出集）",
        "train.curves": "训练曲线",
        "train.results": "结果",
        "train.report": "完整报告",
        "train.probe_table": "逐层探针表",
        "explore.prompt": "提示词",
        "explore.vector": "引导向量",
        "explore.vector_info": "你训练或导入的向量，或一个带种子的随机方向",
        "explore.layer": "层",
        "explore.random_seed": "随机种子",
        "explore.relative": "相对单位",
        "explore.relative_info": "α = 1 表示加入的向量与该层典型残差一样长",
        "explore.alpha_max": "α 范围",
        "explore.alpha": "α（引导强度）",
        "explore.alpha_info": "拖动时下一个词元的柱状图实时更新；松开后两侧重新生成",
        "explore.sampling": "采样",
        "explore.greedy": "贪心解码",
        "explore.temperature": "温度",
        "explore.top_k": "Top-k（0 = 关闭）",
        "explore.top_p": "Top-p",
        "explore.repetition": "重复惩罚",
        "explore.max_tokens": "最多生成词元数",
        "explore.seed": "采样种子",
        "explore.delta_limit": "Δlogit 上限（留空 = 向量自带的界，0 = 关闭）",
        "explore.delta_limit_info": "每个引导步中，任一词元的 logit 相对同一文本上未引导模型的变化（中心化后）的最大值；"
                                    "超过时按比例缩小该步的变化。留空时，自带界的向量（带约束的 TSV 向量）在该界内引导："
                                    "它的校准只在训练文本上成立，此项在每一步都成立",
        "explore.generate": "生成",
        "explore.sweep": "剂量-响应扫描",
        "explore.target": "目标词元（可选）",
        "explore.target_info": "在剂量-响应图中跟踪它的概率",
        "explore.readout_empty": "拖动 α 查看 KL、熵和最大 |Δlogit|。",
        "explore.bars": "下一个词元的概率",
        "explore.delta": "词表上的 Δlogit",
        "explore.whole_vocabulary": "整个词表",
        "explore.share": "分享",
        "explore.save_result": "保存结果",
        "explore.run_live": "实时重跑",
        "explore.unsteered": "未引导",
        "explore.steered": "已引导（每个词元的 Δlogit：红 = 提升，紫 = 压低）",
        "explore.token_hint": "点击一个已引导的词元，查看它的对数概率、Δlogit 和最可能的替代词元。",
        "explore.per_token": "逐词元 Δlogit",
        "explore.dose": "剂量-响应",
        "explore.raw": "原始数值",
        "explore.tokens": "词元 / 扫描表",
        "explore.details": "JSON",
        "detect.vector": "TSV 向量",
        "detect.vector_info": "用 TSV 方法训练一个，或导入一个",
        "detect.answers": "待评分的回答（提示词，回答）",
        "detect.from_explore": "使用“探索”页最近一次生成",
        "detect.file": "或上传带标签的文件（给出 AUROC）",
        "detect.run": "评分",
        "detect.empty": "选择一个 TSV 向量，然后输入回答或上传带标签的文件。",
        "detect.scores": "每个回答的 p(真实)",
        "detect.histogram": "分数分布",
        "detect.details": "JSON",
        "export.export_title": "### 导出",
        "export.vector": "向量",
        "export.format": "格式",
        "export.format_info": "native 保留全部内容（TSV 原型、L2S MLP）；gguf 可在 llama.cpp / repeng 中加载",
        "export.export": "导出",
        "export.files": "文件",
        "export.import_title": "### 导入",
        "export.upload": "上传向量文件（任一支持的格式）",
        "export.info": "向量元数据",
    },
}

MESSAGES: dict[str, dict[str, str]] = {
    "en": ENGLISH,
    "zh-CN": {
        "error_title": "错误",
        "cancelled_title": "已取消",
        "notice_title": "提示",
        "yes": "是",
        "no": "否",
        "too_many_prompts": "给出了 {count} 个提示；一次比较最多运行 {limit} 个（每行一个）。",
        "too_few_values": "{what} 给出了 {count} 个不同的值；至少需要 {least} 个。",
        "too_many_values": "{what} 给出了 {count} 个值；最多 {limit} 个。",
        "compare_pairs_summary": "在 {n} 个留出提示中有 {intended} 个按预期方向被引导（{share:.0%}）；{anti} 个相反；"
                                 "{flips} 个的间隔在 ±{top:.4g} 内改变符号；α = {alpha:.4g} 时平均间隔 {margin:+.2f} "
                                 "nats；流畅度 {drop:+.2f} nats/词元。",
        "compare_summary": "{n} 个提示，α = {alpha:.4g}：首个词元的平均 KL {kl:.3f} nats；流畅度 {drop:+.2f} "
                           "nats/词元；不同词元占比 {distinct:.0%}；概念得分 {concept}（{units}）。",
        "concept_units_sd": "沿向量方向的标准差，已引导文本减未引导文本，由未引导模型读取",
        "concept_units_delta_p_truthful": "检测器给出的 p(真实)，已引导文本减未引导文本",
        "concept_units_none": "此向量没有单一方向或检测器可供读取",
        "compare_needs_pairs_chart": "间隔和可引导性需要成对数据：勾选“改用已加载数据集的留出对”。",
        "no_prompts": "请给出一些提示（每行一个），或在已加载数据集的留出对上比较。",
        "compare_needs_pairs": "在数据集上比较需要对比对（提示、正例、反例）：{detail}",
        "unexpected": "服务器出错了（已记录在服务器日志中）。你的数据和向量都已保留；请重试或修改输入。",
        "no_model": "还没有加载模型：请在“模型”页加载。",
        "model_load_failed": "无法加载模型：{detail}",
        "model_loading": "正在加载模型… {detail}",
        "model_facts": "**{model_id}**（{model_type}）· {num_layers} 层 · 隐藏维度 {hidden_size} · 词表 {vocab_size} · "
                       "lm_head 与嵌入共享：{tied_lm_head} · {parameters} 个参数 · {device} {dtype} · {weights} · "
                       "加载用时 {load_seconds} 秒",
        "weights_float32": "float32 权重",
        "weights_bfloat16": "bfloat16 权重与运算",
        "weights_int8_exact": "int8 权重（GGUF 自带的编码），float32 运算",
        "weights_int8_rounded": "int8 权重（按输出行取整），float32 运算",
        "weights_cost": "{kind}：与 float32 相比，最大 |Δp| {dp}，top-1 {top1}，最大 |ΔΔlogit| {ddlogit}（在 {prompts} "
                        "个固定提示上测得）",
        "weights_int8_declined": "{kind}（int8 测得最大 |Δp| {dp}，top-1 {top1}：超出默认的界限，因此用 float32）",
        "unknown_vector": "本会话中没有名为“{name}”的向量（现有：{known}）。请先训练或导入一个。",
        "bad_layer": "第 {layer} 层不存在：该模型的层编号为 0 到 {last}。",
        "steering_failed": "该向量无法引导当前模型：{detail}",
        "explore_failed": "无法计算引导后的分布：{detail}",
        "input_dependent_projection": "该向量依赖输入（L2S）：没有单一方向可以通过 lm_head 投影。",
        "empty_prompt": "提示词为空：请输入一些文字。",
        "bad_sampling": "采样设置有误：{detail}",
        "generation_failed": "生成失败：{detail}",
        "sweep_unsupported": "剂量-响应扫描需要单一的固定方向；该向量依赖输入或作用于多个位置。",
        "unknown_bundled": "没有名为“{name}”的内置数据集（可用：{known}）。",
        "no_file": "没有提供文件。",
        "file_missing": "找不到文件 {name}（上传可能已过期）；请重新上传。",
        "file_too_large": "{name} 大小为 {size} MB，超过了 {limit} MB 的上限。",
        "dataset_invalid": "无法使用 {name}：{detail}。之前加载的数据保持不变。",
        "cell_too_long": "无法使用 {name}：第 {row} 行“{column}”列有 {size} 个字符；此服务器每个单元格最多读取 {limit} "
                         "个字符。之前加载的数据保持不变。",
        "column_name_too_long": "无法使用 {name}：列“{column}…”的列名有 {size} 个字符；上限为 {limit}。之前加载的数据保持不变。",
        "no_dataset": "本会话还没有加载数据集：请先使用“数据”页。",
        "training_failed": "训练失败：{detail}",
        "unknown_method": "未知方法“{method}”（可选：{known}）。",
        "bad_settings": "设置被拒绝：{detail}",
        "too_many_answers": "要评分的回答有 {count} 条；此服务器每次最多评分 {limit} 条。",
        "too_many_rows": "数据集有 {rows} 行；此服务器上的训练最多读取 {limit} 行。请上传一个子集（按完整的问题或分组）再训练。",
        "cancel_asked": "正在停止当前任务……",
        "nothing_to_cancel": "此会话中没有正在运行的任务。",
        "link_notice": "来自链接：{detail}。",
        "link_fallback": "改为显示“{shown}”，使用它自己的层、α 和范围（链接中的设置是为链接里的向量选的）。",
        "no_steering": "α = 0 时没有引导：拖动滑块，看看它提升和压低了哪些词元。",
        "model_switch_off": "此服务器已关闭更换模型：模型由管理员在启动时选定"
                            "（python app.py --model ... --allow-model-switch 可允许访客切换）。",
        "model_not_allowed": "该模型不在此服务器的列表中；可选：{known}。",
        "bad_device": "不允许设备“{device}”：请使用 auto、cpu、cuda、cuda:N、mps 或 multi。",
        "bad_dtype": "不允许数据类型“{dtype}”：请使用 {known} 之一。",
        "bad_weights": "未知的权重精度“{weights}”：请使用 {known} 之一。",
        "session_expired": "此页面的会话闲置超过 {hours} 小时，服务器已将其清除；其数据和向量已丢失。请重新加载后继续。",
        "too_many_new_sessions": "来自你的地址的新会话过多（每分钟最多 {limit} 个）；请在 {wait} 秒后重试。已打开的会话不受影响。",
        "sessions_full": "服务器正忙：它最多保留 {limit} 个会话，而每个会话都保存着访客的工作。请稍后再试。",
        "address_sessions_full": "服务器正忙：你的地址已有 {limit} 个保存着工作的会话。请使用其中之一，或稍后再试。",
        "session_busy": "服务器正忙：此会话已有 {count} 个生成在运行。请等其中一个完成。",
        "queue_session_full": "服务器正忙：此页面已有 {count} 个请求在等待或运行。请等它们完成。",
        "queue_address_full": "服务器正忙：你的地址已有 {count} 个请求在等待。请稍后再试。",
        "superseded": "已被此页面的一个更新的同类请求取代。",
        "waiting_for_memory": "正在等待工作内存：已占用 {used} / {total} MB（其中 {long} MB 被比较等长任务占用）。",
        "compare_too_large": "此比较中的一个提示（{tokens} 个词元加 {new_tokens} 个新词元，3 行）需要 {need} MB 工作内存；"
                             "比较最多可用此服务器 {total} MB 中的 {limit} MB。请缩短提示或减少新词元数。",
        "compare_too_slow": "按此服务器实测的速度，此比较约需 {estimate} 秒（{prompts} 个提示，共 {tokens} 个提示词元，"
                            "每个 {new_tokens} 个新词元）；时间上限为 {limit} 秒。请最多使用 {fit} 个提示，或减少新词元、缩短提示。",
        "compare_timeout": "比较在任何提示完成之前就达到了时间上限（{limit} 秒）。请减少提示或新词元，或缩短提示。",
        "compare_stopped": "已在时间上限（{limit} 秒）处停止：{total} 个提示中完成了 {done} 个；表格和图表显示的是这些。",
        "memory_busy": "服务器正忙：正在运行的请求占用了它的工作内存（共 {limit} MB）。请稍后再试。",
        "job_running": "此会话已有一个任务在运行：请等待它完成或先取消。",
        "number_not_a_number": "{what}必须是数值，收到 {value}。",
        "number_not_finite": "{what}必须是有限的数值，收到 {value}。",
        "number_not_whole": "{what}必须是整数，收到 {value}。",
        "number_too_small": "{what}至少为 {low}，收到 {value}。",
        "number_too_large": "{what}至多为 {high}，收到 {value}。",
        "number_not_positive": "{what}必须大于 0，收到 {value}。",
        "not_a_flag": "{what}必须是真或假。",
        "not_a_choice": "{what}：“{value}”不在可选项中。",
        "bad_input": "无法读取{what}：{detail}。",
        "wrong_inputs": "此接口接受 {needed} 个值；请求发送了 {got} 个。",
        "body_too_large": "请求大小为 {size} MB；此服务器每个请求最多接受 {limit} MB。",
        "text_not_text": "{what}必须是文本。",
        "text_empty": "{what}为空。",
        "text_too_long": "{what}有 {size} 个字符；上限为 {limit}。",
        "text_not_unicode": "{what}含有不是有效文本的字符（位置 {position}）。",
        "too_many_tokens": "{what}长 {tokens} 个词元；此服务器最多接受 {limit} 个词元。",
        "request_too_large": "此请求（{tokens} 个词元 × {rows} 行）约需 {need} MB 工作内存；此服务器每个请求最多允许 "
                             "{limit} MB。请使用更短的文本或更少的行。",
        "row_too_long": "第 {row} 行的 {column} 长 {tokens} 个词元；此服务器每段文本最多接受 {limit} 个词元。",
        "row_too_many_chars": "第 {row} 行的 {column} 有 {size} 个字符；此服务器每段文本最多接受 {limit} 个字符。",
        "data_too_large": "数据集的文本共至少 {tokens} 个词元；此服务器上的任务最多读取 {limit} 个。请上传一个子集。",
        "data_too_many_chars": "数据集的文本共 {chars} 个字符，因此超过 {limit} 个词元（该模型的任何词元都不超过 {longest} "
                               "个字符）；此服务器上的任务最多读取 {limit} 个词元。请上传一个子集。",
        "push_overflows": "α × 该向量会把残差流推到长度 {size}，超出模型 {dtype} 运算的数值范围：请使用更小的 α。",
        "owner_quota": "你保存的{kind}已达此处上限（{limit} 个）；请删除一个再保存。",
        "owner_bytes": "你保存的内容已达此服务器的上限（{limit} MB）；请删除一些再保存。",
        "store_full": "服务器的库已满（{limit} MB）；请稍后再试，或联系管理员。",
        "library_full": "服务器的库已满（磁盘没有空间），因此这项内容无法保存；你之前保存的内容都还在。请稍后再试，或联系服务器管理员。",
        "library_unwritable": "服务器的库暂时无法写入，因此这项内容无法保存；你之前保存的内容都还在。请稍后再试，或联系服务器管理员。",
        "unknown_id": "没有该 id 的共享向量或已保存结果（或其所有者已停止分享）。",
        "too_many_misses": "来自你的地址的不存在的 id 过多（每分钟 {limit} 个）；请等一分钟。",
        "not_own_vector": "“{name}”不是你保存的向量：只能分享你自己的向量。",
        "not_kept": "此会话不保存任何内容（此服务器没有库，或页面没有所有者）：请导出文件以保留你的工作。",
        "shared": "已分享：任何拿到链接的人都能以只读方式打开此向量，直到你停止分享。",
        "unshared": "已停止分享“{name}”：它的链接不再能打开它。",
        "saved_result": "已保存：链接会直接显示此视图，无需运行模型。",
        "result_view": "一个已保存的结果（保存于 {when}）。实时重跑以检查它能否复现。",
        "comparison_view": "一个已保存的比较（保存于 {when}）显示在“多个提示”页；点“比较”可实时重跑。",
        "stale_bars": "这是按之前的设置算出的：拖动 α 或在提示框按 Shift+回车即可更新。",
        "stale_generations": "这是按之前的设置生成的：点击“生成”即可更新。",
        "stale_dose": "这是按之前的设置算出的：点击“剂量-响应扫描”即可更新。",
        "stale_train": "这是按之前的设置训练的：点击“训练”即可更新。",
        "stale_probe": "这是按之前的设置算出的：点击“逐层探测”即可更新。",
        "stale_detect": "这是按之前的向量或回答算出的：点击“评分”即可更新。",
        "stale_compare": "这是按之前的设置算出的：点击“比较”即可更新。",
        "no_comparison": "“多个提示”页还没有进行任何比较。",
        "saved_comparison": "已保存：链接会直接打开此比较，无需运行模型。",
        "result_other_model": "此结果是在另一个模型（{model}）上得到的；在这里实时重跑会有所不同。",
        "reproduced": "实时重跑：完全复现（相同的词元{numbers}）。",
        "not_reproduced": "实时重跑：与保存的结果不同（{detail}）。",
        "work_not_kept": "此服务器不保存你的工作：它只存在于本页面的会话中。请导出文件以保留它。",
        "concepts_failed": "无法计算此面板：{detail}",
        "concepts_no_demo": "请先运行爆炸演示（上面的按钮），再进行修复。",
        "settings_json_not_text": "设置必须是 JSON 文本：形如 {{\"epochs\": 10}} 的对象。",
        "settings_json_too_long": "设置有 {size} 个字符；最多 {limit} 个。",
        "settings_json_long_number": "设置中的一个数字长 {size} 个字符；最多 {digits} 位。",
        "settings_json_not_finite": "设置中含有 {name}，它不是有限的数字；请给出像 0.5 这样的数字。",
        "settings_json_nested": "设置嵌套过深；请给出像 {{\"epochs\": 10}} 这样的扁平对象。",
        "settings_json_unreadable": "设置不是有效的 JSON（第 {line} 行，第 {column} 列）。请写成形如 "
                                    "{{\"epochs\": 10, \"lr\": 0.01}} 的对象：名称用双引号括起，每个名称后加冒号，"
                                    "各项之间用逗号分隔。",
        "settings_json_not_object": "设置必须是由名称和值组成的 JSON 对象，例如 {{\"epochs\": 10}}。",
        "name_hidden_character": "名称“{name}”含有 {code}：这个字符不可见，或会改变周围文字的顺序，名称因此无法按原样"
                                 "显示；请换一个不含它的名称。",
        "too_many_vectors": "此会话已有 {limit} 个向量，已达上限；请刷新页面开始新会话以训练或导入更多向量。",
        "session_full": "此会话的数据和向量将超过 {limit} MB 的上限；请刷新页面开始新会话。",
        "server_full": "此服务器保存的访客数据和向量已达上限（共 {limit} MB）；请稍后再试，或联系管理员。",
        "prompt_too_long": "提示词有 {size} 个字符；上限为 {limit}。",
        "busy": "服务器正忙（{detail}）。请稍后再试。",
        "generation_timeout": "生成已停止：{detail}。",
        "job_queued": "正在等待另一位访客的任务完成…",
        "job_cancelled": "已取消：没有保留任何结果，你的会话保持原样。",
        "job_too_long": "已在 {limit} 秒后停止（此服务器单个任务的上限）：没有保留任何结果。请减少行数或训练轮数。",
        "not_tsv": "向量“{name}”由方法“{method}”生成；检测需要 TSV 向量。",
        "no_answers": "没有可评分的回答：请至少输入一个回答。",
        "detect_failed": "检测失败：{detail}",
        "unknown_format": "未知格式“{fmt}”（可选：{known}）。",
        "export_failed": "无法导出为 {fmt}：{detail}",
        "import_failed": "无法导入 {name}：{detail}",
        "readout": "**KL**(未引导‖已引导) = {kl:.4f} nats · **熵** {hu:.3f} → {hs:.3f} nats · "
                   "**最大 |Δlogit|** = {maxd:.3f}，出现在 {token}（中心化，在引导前或后概率 ≥ 0.1% 的 {likely} 个词元中）"
                   "{warn} · 整个词表：{rawd:.3f}，出现在 {rawtoken}",
        "readout_warn": " ⚠ **logits 爆炸**（超过 {threshold:g}）",
        "no_tokens": "没有生成任何词元。",
        "token_detail": "词元 {token}：对数概率 {logprob:.3f}，Δlogit {delta:+.3f}（直接效应估计 {direct:+.3f}）。"
                        "替代词元：{alts}",
        "drag_alpha": "拖动 α 查看分布的变化。",
        "dataset_summary": "**{name}**：{kind}，{rows} 行；列：{columns}",
        "dataset_warning": "⚠ {detail}",
        "no_curves": "该方法没有逐轮的训练曲线。",
        "trained": "已训练 **{name}**；它已出现在“探索”“检测”和“导出”页的向量列表中。",
        "answers_table": "回答表需要两列：提示词和回答。",
        "pick_tsv": "请先选择一个 TSV 向量。",
        "detect_summary": "已为 {n} 个回答评分 · AUROC：{auroc}",
        "no_generation": "“探索”页还没有生成任何内容。",
        "exported": "已写出 {n} 个 {fmt} 格式的文件：{names}",
        "imported": "已导入 **{name}**；它已出现在向量列表中。",
        "import_warning": "⚠ {detail}",
        "share_failed": "无法创建公开分享链接（{detail}）；应用仍可在本机访问。",
    },
}

PLOTS: dict[str, dict[str, dict[str, str]]] = {
    "en": {
        "bars": {"title": "Next token: unsteered vs steered", "unsteered": "unsteered", "steered": "steered",
                 "probability": "probability"},
        "delta": {"title": "Δlogit: most promoted (red) and suppressed (purple) likely tokens (p ≥ 0.1 % before or after)",
                  "title_vocabulary": "Δlogit: most promoted (red) and suppressed (purple) tokens of the whole vocabulary",
                  "rule": "max centred |Δlogit|, likely tokens", "rule_vocabulary": "max |Δlogit|, whole vocabulary",
                  "exploded": "logits exploding"},
        "per_token": {"title": "Per-token Δlogit of the steered generation", "actual": "actual Δlogit",
                      "direct": "direct effect (skip path, through the final norm)"},
        "dose": {"title": "Dose-response", "kl": "KL(unsteered‖steered)", "entropy": "entropy (nats)",
                 "target": "p(target)", "max_delta": "max |Δlogit|", "readable": "readable: KL ≤ 5 nats"},
        "norms": {"title": "Residual-stream norm per layer", "layer": "layer", "norm": "mean ‖h‖"},
        "probe": {"title": "Per-layer probe (held-out)", "layer": "layer", "best": "best"},
        "margins": {"title": "Margin over α, per prompt", "prompt": "one prompt", "mean": "mean",
                    "margin": "log p(positive) − log p(negative)"},
        "slopes": {"title": "Steerability of each prompt", "slope": "steerability (margin per unit α)",
                   "count": "prompts"},
        "curves": {"title": "Training curves"},
        "alpha_sweep": {"title": "KL to the unsteered model vs α (sets the recommended α range)"},
        "heads": {"title": "ITI: per-head probe accuracy (validation)", "layer": "layer", "head": "head",
                  "accuracy": "accuracy"},
        "balance": {"title": "Class balance"},
        "detect": {"title": "Detection scores", "score": "p(truthful)"},
    },
    "zh-CN": {
        "bars": {"title": "下一个词元：未引导 vs 已引导", "unsteered": "未引导", "steered": "已引导",
                 "probability": "概率"},
        "delta": {"title": "Δlogit：提升（红）和压低（紫）最多的可能词元（引导前或后 p ≥ 0.1%）",
                  "title_vocabulary": "Δlogit：整个词表中提升（红）和压低（紫）最多的词元",
                  "rule": "最大中心化 |Δlogit|，可能词元", "rule_vocabulary": "最大 |Δlogit|，整个词表",
                  "exploded": "logits 爆炸"},
        "per_token": {"title": "已引导生成的逐词元 Δlogit", "actual": "实际 Δlogit", "direct": "直接效应（跳跃连接路径，经最终归一化）"},
        "dose": {"title": "剂量-响应", "kl": "KL(未引导‖已引导)", "entropy": "熵（nats）", "target": "p(目标)",
                 "max_delta": "最大 |Δlogit|", "readable": "可读区：KL ≤ 5 nats"},
        "norms": {"title": "各层残差流范数", "layer": "层", "norm": "平均 ‖h‖"},
        "probe": {"title": "逐层探针（留出集）", "layer": "层", "best": "最佳"},
        "margins": {"title": "每个提示的间隔随 α 的变化", "prompt": "单个提示", "mean": "平均",
                    "margin": "log p(正例) − log p(反例)"},
        "slopes": {"title": "每个提示的可引导性", "slope": "可引导性（每单位 α 的间隔变化）", "count": "提示数"},
        "curves": {"title": "训练曲线"},
        "alpha_sweep": {"title": "与未引导模型的 KL 随 α 的变化（决定推荐的 α 范围）"},
        "heads": {"title": "ITI：各注意力头探针准确率（验证集）", "layer": "层", "head": "头", "accuracy": "准确率"},
        "balance": {"title": "类别分布"},
        "detect": {"title": "检测分数", "score": "p(真实)"},
    },
}


# Field names in messages ({what}), by language; English ones live with the messages (steer_ui.messages.FIELDS).
FIELD_NAMES: dict[str, dict[str, str]] = {
    "en": FIELDS,
    "zh-CN": {
        "alpha": "α", "alpha_max": "α 上限", "layer": "层", "seed": "随机种子", "top_k": "Top-k", "top_p": "Top-p",
        "temperature": "温度", "repetition_penalty": "重复惩罚", "max_new_tokens": "新词元数",
        "max_delta_logit": "Δlogit 上限", "points": "扫描点数", "prompt": "提示词", "target": "目标词元",
        "answer": "回答", "relative": "相对单位", "greedy": "贪心解码", "bins": "分箱数", "draws": "抽样次数",
        "seq_len": "序列长度", "batch": "批大小", "tokens": "词元数", "bound": "上界", "steps": "步数",
        "token": "词元", "settings": "设置", "vector": "向量", "method": "方法", "format": "格式", "schema": "数据格式",
        "dataset": "数据集", "position": "位置", "language": "语言", "dtype": "数据类型", "input": "输入", "auto_layer": "自动选层",
    },
}


def message(lang: str | None, key: str, **params: Any) -> str:
    """A server-side message in ``lang`` (English when the key has no translation)."""
    lang = normalise_lang(lang)
    if "what" in params:  # a field's name, in the same language as the message around it
        params = {**params, "what": field_name(params["what"], FIELD_NAMES[lang])}
    template = MESSAGES[lang].get(key) or MESSAGES["en"].get(key)
    if template is None:
        return key if not params else f"{key}: {params}"
    try:
        return template.format(**params)
    except (KeyError, IndexError, ValueError):
        return MESSAGES["en"].get(key, key).format_map({k: params.get(k, "?") for k in placeholders(template)})


# Markdown's specials that make links, images, code, emphasis, tables or quotes (an underscore inside a word
# makes no emphasis, so file names keep theirs as they are)
MARKDOWN_SPECIALS = "\\`*{}[]()#+!|~>"
# where an autolink starts: a scheme's "://", "www." and an e-mail's "@"
AUTOLINK = re.compile(r"(?<=[A-Za-z0-9]):(?=//)|(?<=\bwww)\.|@", re.IGNORECASE)


def plain(text: Any) -> str:
    """``text`` (from a file, a link, a vector's name or the vocabulary) as Markdown that shows it literally:
    HTML's ``&`` and ``<`` as entities, Markdown's specials and autolink starts backslash-escaped, so no link,
    image, autolink or tag."""
    escaped = str(text).replace("&", "&amp;").replace("<", "&lt;")
    escaped = "".join("\\" + ch if ch in MARKDOWN_SPECIALS else ch for ch in escaped)
    escaped = re.sub(r"(?:^|(?<=\s))_|_(?=\s|$)", r"\\_", escaped)  # an underscore at a word's edge
    return AUTOLINK.sub(lambda m: "\\" + m.group(0), escaped)


def markdown(lang: str | None, key: str, **params: Any) -> str:
    """:func:`message` for a Markdown component: every text parameter is shown as :func:`plain` text."""
    return message(lang, key, **{k: plain(v) if isinstance(v, str) else v for k, v in params.items()})


def label(lang: str | None, key: str) -> str:
    """A label's text in ``lang`` (for server-side use and tests)."""
    lang = normalise_lang(lang)
    return TRANSLATIONS[lang].get(key) or TRANSLATIONS["en"][key]


def plot_labels(lang: str | None, plot: str) -> dict[str, str]:
    lang = normalise_lang(lang)
    return {**PLOTS["en"].get(plot, {}), **PLOTS[lang].get(plot, {})}


def placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def extend(labels: dict[str, dict[str, str]] | None = None, messages: dict[str, dict[str, str]] | None = None,
           plots: dict[str, dict[str, dict[str, str]]] | None = None) -> None:
    """Add keys (per language) before the app is built; existing keys may not be redefined differently."""
    for target, extra in ((TRANSLATIONS, labels), (MESSAGES, messages), (PLOTS, plots)):
        for lang, entries in (extra or {}).items():
            lang = normalise_lang(lang)
            for key, text in entries.items():
                if key in target[lang] and target[lang][key] != text:
                    raise ValueError(f"i18n key '{key}' ({lang}) is already defined with different text")
                target[lang][key] = text


class _LazyI18n:
    """``GR_I18N(key)`` -> gr.I18n key object; the gr.I18n itself is made when the app is built."""

    def __call__(self, key: str):
        from gradio.i18n import I18nData

        return I18nData(key)


GR_I18N = _LazyI18n()


def gr_i18n():
    """The gr.I18n for ``launch(i18n=...)``: English, Simplified Chinese (also under 'zh' for bare-'zh' browsers)."""
    import gradio as gr

    zh = {**TRANSLATIONS["en"], **TRANSLATIONS["zh-CN"]}
    return gr.I18n(en=dict(TRANSLATIONS["en"]), **{"zh-CN": zh, "zh": zh})


# ----------------------------------------------------------------------------------------------------------------
# Concepts tab (issue 9): an appended block, owned by the Concepts tab's author (steer_ui/ui/concepts_tab.py).
extend(
    labels={
        "en": {
            "concepts.intro": "### The ideas behind steering, live on the loaded model\nEvery number below is "
                              "computed from the model loaded now; load another model in the Model tab and they "
                              "change with it.",
            "concepts.prompt": "Prompt",
            "concepts.details": "Raw numbers (JSON)",
            "concepts.lm_head.title": "1 · lm_head: one score per token",
            "concepts.lm_head.explain": "The last step of a language model is a single matrix, the unembedding "
                                        "W_U (lm_head), with one row per vocabulary token. The final hidden state h "
                                        "(after the final norm) is multiplied by it: logit(t) = h · W_U[t]. With a "
                                        "large vocabulary this one matrix is a big part of a small model, and many "
                                        "models tie it to the input embedding (the same numbers read tokens in and "
                                        "score them out). A steering vector added to the residual stream reaches "
                                        "W_U through the skip connections, so its dot product with a row moves that "
                                        "token's logit directly; long rows are tokens any hidden state pointing "
                                        "their way promotes strongly.",
            "concepts.lm_head.bins": "Histogram bins",
            "concepts.lm_head.run": "Measure lm_head",
            "concepts.lm_head.histogram": "Norms of the lm_head rows",
            "concepts.lm_head.extremes": "Longest and shortest rows",
            "concepts.sampling.title": "2 · Logits → probabilities → sampling",
            "concepts.sampling.explain": "For the prompt, the model gives one logit per token; softmax turns them "
                                         "into probabilities. The sampler then reshapes them in this order, exactly "
                                         "as Generate does: the repetition penalty divides the positive logits (and "
                                         "multiplies the negative ones) of tokens already in the text, temperature "
                                         "divides every logit (below 1 sharpens, above 1 flattens, 0 means greedy: "
                                         "always the most likely token), top-k keeps the k most likely tokens and "
                                         "top-p keeps the smallest set whose probability reaches p. One token is "
                                         "then drawn from what survives. Steering changes the logits before all of "
                                         "this, so a steered token can still be filtered out, or be the only "
                                         "survivor.",
            "concepts.sampling.temperature": "Temperature",
            "concepts.sampling.temperature_info": "0 = greedy (always the most likely token)",
            "concepts.sampling.top_k": "Top-k (0 = off)",
            "concepts.sampling.top_p": "Top-p (nucleus)",
            "concepts.sampling.repetition": "Repetition penalty",
            "concepts.sampling.repetition_info": "1 = off; tokens of the prompt count as already seen",
            "concepts.sampling.run": "Show the filters",
            "concepts.sampling.n": "Draws",
            "concepts.sampling.seed": "Sampling seed",
            "concepts.sampling.sample": "Sample 100 times",
            "concepts.sampling.chart": "Probabilities through the filters",
            "concepts.sampling.sample_chart": "Sampled frequencies vs probabilities",
            "concepts.sampling.table": "Every shown token, stage by stage",
            "concepts.explosion.title": "3 · The logit explosion and its fix",
            "concepts.explosion.explain": "Take one rare token t and steer along its own unembedding row: "
                                          "v = W_U[t] / ‖W_U[t]‖. Whatever the layers in between do, the skip "
                                          "connections carry α·v to the final residual, and the dot product "
                                          "α·v·W_U[t] is huge, so t's logit jumps, the next-token distribution "
                                          "collapses onto t and the generation repeats it. The fix keeps the "
                                          "layer and the strength but rotates the direction, with a penalty on "
                                          "every |Δlogit| above a bound and on the KL divergence (the TSV "
                                          "constraints), until no token's logit moves more than the bound; the "
                                          "generation reads normally again.",
            "concepts.explosion.layer": "Layer",
            "concepts.explosion.layer_info": "empty = the last block",
            "concepts.explosion.alpha": "α (relative units)",
            "concepts.explosion.alpha_info": "a fraction of the layer's mean residual norm",
            "concepts.explosion.token": "Token t",
            "concepts.explosion.token_info": "one token, e.g. ' zebra'; empty = the word the model least expects here",
            "concepts.explosion.bound": "Bound on the centred |Δlogit| (Δlogit minus its vocabulary mean)",
            "concepts.explosion.steps": "Optimisation steps",
            "concepts.explosion.run": "Explode, then fix",
            "concepts.explosion.chart": "|Δlogit| before and after the constraint",
            "concepts.explosion.curve": "Constrained optimisation",
            "concepts.explosion.bars": "Next token with the aligned vector",
            "concepts.explosion.bars_fixed": "Next token with the constrained vector",
            "concepts.explosion.unsteered": "Unsteered generation",
            "concepts.explosion.exploded": "Generation with the aligned vector",
            "concepts.explosion.fixed": "Generation with the constrained vector",
            "concepts.kv.title": "4 · The KV cache",
            "concepts.kv.explain": "While generating, every layer keeps the keys and values of all earlier "
                                   "positions so each new token attends to them without recomputing them: "
                                   "bytes = 2 (K and V) × layers × batch × KV heads × sequence length × head "
                                   "dimension × bytes per value. Grouped-query attention (GQA) shares each KV head "
                                   "between several query heads, which divides the cache by that factor compared "
                                   "with full multi-head attention; sliding-window layers keep only their window. "
                                   "The cache trades memory for time: without it, every step re-runs the whole "
                                   "sequence.",
            "concepts.kv.seq_len": "Sequence length (tokens)",
            "concepts.kv.batch": "Batch size",
            "concepts.kv.dtype": "Cache data type",
            "concepts.kv.run": "Compute the cache size",
            "concepts.kv.chart": "Cache size vs sequence length",
            "concepts.kv.tokens": "Tokens to generate",
            "concepts.kv.time": "Time it with and without the cache",
            "concepts.kv.timing_chart": "Time per token",
        },
        "zh-CN": {
            "concepts.intro": "### 引导背后的原理，在已加载的模型上实时计算\n下面每个数字都来自当前加载的模型；在“模型”页换一个模型，"
                              "这些数字也随之改变。",
            "concepts.prompt": "提示词",
            "concepts.details": "原始数值（JSON）",
            "concepts.lm_head.title": "1 · lm_head：每个词元一个分数",
            "concepts.lm_head.explain": "语言模型的最后一步是一个矩阵，即反嵌入矩阵 W_U（lm_head），词表中每个词元对应一行。"
                                        "最终隐藏状态 h（经过最终归一化）与它相乘：logit(t) = h · W_U[t]。词表很大时，"
                                        "这一个矩阵就占了小模型参数的很大一部分；许多模型把它与输入嵌入共享（同一组数字既用来读入词元，"
                                        "也用来给词元打分）。加到残差流上的引导向量会经由跳跃连接到达 W_U，因此它与某一行的点积会直接改变"
                                        "该词元的 logit；行范数大的词元，只要隐藏状态朝向它，就会被强烈提升。",
            "concepts.lm_head.bins": "直方图分箱数",
            "concepts.lm_head.run": "测量 lm_head",
            "concepts.lm_head.histogram": "lm_head 各行的范数",
            "concepts.lm_head.extremes": "范数最大和最小的行",
            "concepts.sampling.title": "2 · Logits → 概率 → 采样",
            "concepts.sampling.explain": "对于给定提示词，模型为每个词元给出一个 logit；softmax 把它们变成概率。随后采样器按以下顺序"
                                         "调整它们，与“生成”完全一致：重复惩罚把文本中已出现词元的正 logit 除以惩罚系数（负 logit "
                                         "则乘以它）；温度把所有 logit 相除（小于 1 更尖锐，大于 1 更平坦，0 表示贪心解码：总是选最"
                                         "可能的词元）；top-k 只保留最可能的 k 个词元；top-p 保留概率之和达到 p 的最小集合。然后从"
                                         "保留下来的词元中抽取一个。引导在这一切之前改变 logits，所以被引导的词元仍可能被过滤掉，"
                                         "也可能成为唯一的幸存者。",
            "concepts.sampling.temperature": "温度",
            "concepts.sampling.temperature_info": "0 = 贪心解码（总是选最可能的词元）",
            "concepts.sampling.top_k": "Top-k（0 = 关闭）",
            "concepts.sampling.top_p": "Top-p（核采样）",
            "concepts.sampling.repetition": "重复惩罚",
            "concepts.sampling.repetition_info": "1 = 关闭；提示词中的词元视为已出现",
            "concepts.sampling.run": "显示各过滤步骤",
            "concepts.sampling.n": "抽样次数",
            "concepts.sampling.seed": "采样种子",
            "concepts.sampling.sample": "抽样 100 次",
            "concepts.sampling.chart": "经过各过滤步骤的概率",
            "concepts.sampling.sample_chart": "抽样频率与概率对比",
            "concepts.sampling.table": "所显示词元的逐步数值",
            "concepts.explosion.title": "3 · Logit 爆炸及其修复",
            "concepts.explosion.explain": "取一个罕见词元 t，沿它自己的反嵌入行进行引导：v = W_U[t] / ‖W_U[t]‖。无论中间各层"
                                          "做了什么，跳跃连接都会把 α·v 带到最终残差，而点积 α·v·W_U[t] 非常大，于是 t 的 logit "
                                          "骤增，下一个词元的分布坍缩到 t 上，生成结果不断重复它。修复方法保持层和强度不变，只旋转"
                                          "方向：对每个超过上限的 |Δlogit| 以及 KL 散度施加惩罚（即 TSV 的约束），直到没有任何词元"
                                          "的 logit 变化超过上限；生成结果重新变得正常。",
            "concepts.explosion.layer": "层",
            "concepts.explosion.layer_info": "留空 = 最后一个模块",
            "concepts.explosion.alpha": "α（相对单位）",
            "concepts.explosion.alpha_info": "该层平均残差范数的倍数",
            "concepts.explosion.token": "词元 t",
            "concepts.explosion.token_info": "单个词元，例如 ' zebra'；留空 = 模型在此处最不可能预测的单词",
            "concepts.explosion.bound": "中心化 |Δlogit|（Δlogit 减去其词表均值）的上限",
            "concepts.explosion.steps": "优化步数",
            "concepts.explosion.run": "先引爆，再修复",
            "concepts.explosion.chart": "约束前后的 |Δlogit|",
            "concepts.explosion.curve": "带约束的优化过程",
            "concepts.explosion.bars": "使用对齐向量时的下一个词元",
            "concepts.explosion.bars_fixed": "使用约束后向量时的下一个词元",
            "concepts.explosion.unsteered": "未引导的生成",
            "concepts.explosion.exploded": "使用对齐向量的生成",
            "concepts.explosion.fixed": "使用约束后向量的生成",
            "concepts.kv.title": "4 · KV 缓存",
            "concepts.kv.explain": "生成时，每一层都保存之前所有位置的键和值，这样每个新词元可以直接关注它们而无需重新计算："
                                   "字节数 = 2（K 和 V）× 层数 × 批大小 × KV 头数 × 序列长度 × 头维度 × 每个数值的字节数。"
                                   "分组查询注意力（GQA）让多个查询头共享一个 KV 头，与完整的多头注意力相比，缓存按这个倍数缩小；"
                                   "滑动窗口层只保留窗口内的位置。缓存用内存换时间：没有它，每一步都要重新计算整个序列。",
            "concepts.kv.seq_len": "序列长度（词元数）",
            "concepts.kv.batch": "批大小",
            "concepts.kv.dtype": "缓存数据类型",
            "concepts.kv.run": "计算缓存大小",
            "concepts.kv.chart": "缓存大小随序列长度的变化",
            "concepts.kv.tokens": "要生成的词元数",
            "concepts.kv.time": "测量有无缓存的用时",
            "concepts.kv.timing_chart": "每个词元的用时",
        },
    },
    messages={
        "en": {
            "concepts_yes": "yes",
            "concepts_no": "no",
            "concepts_bias": " · with a bias vector",
            "concepts_lm_head": "**lm_head** is a {rows} × {cols} matrix: **{params}** parameters, **{share}** of the "
                                "model's {total} · tied to the input embedding: **{tied}** · {size} in {dtype}{bias}",
            "concepts_row_stats": "Row norms over {rows} tokens: mean {mean}, std {std}, min {min}, max {max}.",
            "concepts_sampling": "**Greedy choice**: {token} (p = {prob}) · top-k keeps **{k_kept}** of {vocab} tokens, "
                                 "top-p leaves **{kept}** · entropy {h_raw} → {h_final} nats",
            "concepts_greedy_mode": "Temperature 0 is greedy decoding: the filters do not apply and the sampler always "
                                    "returns {token}.",
            "concepts_sampled": "{n} draws (seed {seed}) gave {distinct} different tokens; total variation distance "
                                "between the frequencies and the probabilities: {tv}.",
            "concepts_explosion": "Steering along the unembedding row of {token} (id {token_id}) at layer {layer}, "
                                  "α = {alpha} relative = {alpha_raw} raw.\n\n"
                                  "| | aligned vector | constrained vector |\n|---|---|---|\n"
                                  "| α·v·W_U[t] (no final norm) | {e_naive} | {f_naive} |\n"
                                  "| Δlogit(t) added at the final residual (through the final norm) | {e_direct} | "
                                  "{f_direct} |\n"
                                  "| Δlogit(t), whole model | {e_delta} | {f_delta} |\n"
                                  "| max \\|Δlogit − mean Δlogit\\| over the vocabulary (centred: what the bound "
                                  "limits, since a shift of every logit moves no probability) | {e_max} | {f_max} |\n"
                                  "| max \\|Δlogit\\|, raw | {e_raw} | {f_raw} |\n"
                                  "| p(t): unsteered → steered | {e_prob} | {f_prob} |\n"
                                  "| KL(unsteered‖steered), nats | {e_kl} | {f_kl} |\n"
                                  "| t among the generated tokens | {e_rep} | {f_rep} |",
            "concepts_fixing": "Now optimising the direction under the bound…",
            "concepts_constraint": "Constraint: bound {bound} on {prompts} prompt(s), {steps} steps: max centred |Δlogit| "
                                   "{before} → **{after}** ({verdict}); cosine to the original direction {cosine}.",
            "concepts_within": "within the bound",
            "concepts_over": "still above the bound: try more steps or a smaller α",
            "concepts_kv": "**{bytes}** for {seq_len} tokens, batch {batch}, {dtype}: 2 × {layers} layers × {batch} × "
                           "{kv_heads} KV heads × {seq_len} × {head_dim} × {dtype_bytes} bytes. Full multi-head "
                           "attention ({heads} KV heads) would need **{mha}** ({ratio}×).",
            "concepts_kv_sliding": "{n_sliding} of the {layers} layers only look at a {window}-token window; "
                                   "transformers' cache then keeps **{sliding_bytes}**.",
            "concepts_kv_measured": "Measured on the loaded model: after a {seq_len}-token prompt its cache tensors "
                                    "hold {measured} (formula, windows included: {formula}).",
            "concepts_timing": "{n} tokens after a {prompt_tokens}-token prompt: **{with_s} s** with the cache, "
                               "**{without_s} s** without ({speedup}×); same tokens: {same}; cache at the end: {cache}.",
        },
        "zh-CN": {
            "concepts_yes": "是",
            "concepts_no": "否",
            "concepts_bias": " · 带偏置向量",
            "concepts_lm_head": "**lm_head** 是一个 {rows} × {cols} 的矩阵：**{params}** 个参数，占模型 {total} 个参数的 "
                                "**{share}** · 与输入嵌入共享：**{tied}** · {dtype} 下占 {size}{bias}",
            "concepts_row_stats": "{rows} 个词元的行范数：均值 {mean}，标准差 {std}，最小 {min}，最大 {max}。",
            "concepts_sampling": "**贪心选择**：{token}（p = {prob}）· top-k 在 {vocab} 个词元中保留 **{k_kept}** 个，"
                                 "top-p 之后剩下 **{kept}** 个 · 熵 {h_raw} → {h_final} nats",
            "concepts_greedy_mode": "温度为 0 即贪心解码：过滤器不起作用，采样器总是返回 {token}。",
            "concepts_sampled": "{n} 次抽样（种子 {seed}）得到 {distinct} 个不同的词元；频率与概率之间的总变差距离：{tv}。",
            "concepts_explosion": "沿词元 {token}（id {token_id}）的反嵌入行在第 {layer} 层引导，α = {alpha}（相对）= "
                                  "{alpha_raw}（原始）。\n\n"
                                  "| | 对齐向量 | 约束后向量 |\n|---|---|---|\n"
                                  "| α·v·W_U[t]（不含最终归一化） | {e_naive} | {f_naive} |\n"
                                  "| 加在最终残差上时的 Δlogit(t)（经过最终归一化） | {e_direct} | {f_direct} |\n"
                                  "| Δlogit(t)，完整模型 | {e_delta} | {f_delta} |\n"
                                  "| 词表上的最大 \\|Δlogit − 平均 Δlogit\\|（中心化：上限约束的正是它，因为所有 logit "
                                  "同时平移不改变任何概率） | {e_max} | {f_max} |\n"
                                  "| 最大 \\|Δlogit\\|，原始值 | {e_raw} | {f_raw} |\n"
                                  "| p(t)：未引导 → 已引导 | {e_prob} | {f_prob} |\n"
                                  "| KL(未引导‖已引导)，nats | {e_kl} | {f_kl} |\n"
                                  "| 生成的词元中 t 出现的次数 | {e_rep} | {f_rep} |",
            "concepts_fixing": "正在在上限约束下优化方向……",
            "concepts_constraint": "约束：在 {prompts} 个提示词上以 {bound} 为上限，优化 {steps} 步：最大中心化 |Δlogit| "
                                   "{before} → **{after}**（{verdict}）；与原方向的余弦相似度 {cosine}。",
            "concepts_within": "在上限之内",
            "concepts_over": "仍高于上限：请增加步数或减小 α",
            "concepts_kv": "{seq_len} 个词元、批大小 {batch}、{dtype} 时为 **{bytes}**：2 × {layers} 层 × {batch} × "
                           "{kv_heads} 个 KV 头 × {seq_len} × {head_dim} × {dtype_bytes} 字节。完整多头注意力"
                           "（{heads} 个 KV 头）需要 **{mha}**（{ratio} 倍）。",
            "concepts_kv_sliding": "{layers} 层中有 {n_sliding} 层只关注 {window} 个词元的窗口；transformers 的缓存因此只保留 "
                                   "**{sliding_bytes}**。",
            "concepts_kv_measured": "在已加载模型上实测：{seq_len} 个词元的提示词之后，缓存张量占 {measured}"
                                    "（公式，含滑动窗口：{formula}）。",
            "concepts_timing": "在 {prompt_tokens} 个词元的提示词之后生成 {n} 个词元：有缓存 **{with_s} 秒**，无缓存 "
                               "**{without_s} 秒**（{speedup} 倍）；词元相同：{same}；最终缓存大小：{cache}。",
        },
    },
    plots={
        "en": {
            "concepts_norms": {"title": "Norms of the lm_head rows", "norm": "row norm ‖W_U[t]‖", "tokens": "tokens",
                               "mean": "mean"},
            "concepts_sampling": {"title": "Next token: logits → probabilities → filters", "raw": "softmax(logits)",
                                  "tempered": "after penalty and temperature",
                                  "final": "after top-k and top-p (sampled from)", "probability": "probability"},
            "concepts_sample": {"title": "Sampled {n} times: frequency vs probability", "probability": "probability",
                                "frequency": "frequency", "share": "share"},
            "concepts_explosion": {"title": "The logit explosion and its fix", "naive_direct": "α·v·W_U[t]",
                                   "direct": "Δlogit(t) at the final residual", "delta_logit": "Δlogit(t)",
                                   "max_abs_centred_delta_logit": "max |centred Δlogit|", "exploded": "aligned vector",
                                   "fixed": "constrained vector", "bound": "bound",
                                   "abs_logit": "|value| (log scale)"},
            "concepts_curve": {"title": "Constrained optimisation", "max_delta": "max |centred Δlogit|",
                               "cosine": "cosine to the original", "step": "step"},
            "concepts_kv": {"title": "KV cache size vs sequence length", "this": "this model ({kv} KV heads)",
                            "mha": "full multi-head ({h} KV heads)", "sliding": "with sliding-window layers",
                            "seq_len": "sequence length (tokens)", "bytes": "cache bytes"},
            "concepts_timing": {"title": "Time per token with and without the KV cache", "with": "with cache",
                                "without": "without cache", "step": "generated token", "ms": "milliseconds per token"},
        },
        "zh-CN": {
            "concepts_norms": {"title": "lm_head 各行的范数", "norm": "行范数 ‖W_U[t]‖", "tokens": "词元数", "mean": "均值"},
            "concepts_sampling": {"title": "下一个词元：logits → 概率 → 过滤", "raw": "softmax(logits)",
                                  "tempered": "重复惩罚和温度之后", "final": "top-k 和 top-p 之后（实际抽样分布）",
                                  "probability": "概率"},
            "concepts_sample": {"title": "抽样 {n} 次：频率与概率", "probability": "概率", "frequency": "频率",
                                "share": "占比"},
            "concepts_explosion": {"title": "Logit 爆炸及其修复", "naive_direct": "α·v·W_U[t]",
                                   "direct": "最终残差处的 Δlogit(t)", "delta_logit": "Δlogit(t)",
                                   "max_abs_centred_delta_logit": "最大 |中心化 Δlogit|", "exploded": "对齐向量",
                                   "fixed": "约束后向量", "bound": "上限", "abs_logit": "|数值|（对数刻度）"},
            "concepts_curve": {"title": "带约束的优化过程", "max_delta": "最大 |中心化 Δlogit|", "cosine": "与原方向的余弦",
                               "step": "步"},
            "concepts_kv": {"title": "KV 缓存大小随序列长度的变化", "this": "本模型（{kv} 个 KV 头）",
                            "mha": "完整多头注意力（{h} 个 KV 头）", "sliding": "含滑动窗口层",
                            "seq_len": "序列长度（词元数）", "bytes": "缓存字节数"},
            "concepts_timing": {"title": "有无 KV 缓存时每个词元的用时", "with": "有缓存", "without": "无缓存",
                                "step": "生成的词元", "ms": "每个词元的毫秒数"},
        },
    },
)
