"""Chinese labels and help for every method's generated Train settings (issue #36: the Chinese page showed them in
English)."""
from __future__ import annotations

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

# the help shared by the residual-stream methods (mean-diff, probe, pca)
_POSITION = ("词元位置", "哪个词元的激活代表一行：最后一个词元（last）或补全文本各词元的平均（mean）")
_SEED = ("随机种子", "分组划分（以及其他任何随机过程）的随机种子")
_NORMALIZE = ("归一化", "保存单位向量，而不是长度等于两类均值之差的向量")
_TEST_FRACTION = ("测试集比例", "留出用于测试指标的分组比例")
_KL_BOUND = ("KL 上限", "下一个词元的平均 KL（nats），用来界定推荐的 α 范围")
_TEMPLATE = ("文本模板", "每行的文本：一个恰好含一次 {completion}（也可含 {prompt}）的模板；留空：提示词、一个空格、补全文本")

# "<method>.<setting>": (label, help), for every setting of every registered method but "layer"
ZH: dict[str, tuple[str, str]] = {
    # ------------------------------------------------------------------ mean-diff
    "mean-diff.position": _POSITION,
    "mean-diff.seed": _SEED,
    "mean-diff.normalize": _NORMALIZE,
    "mean-diff.test_fraction": _TEST_FRACTION,
    "mean-diff.kl_bound": _KL_BOUND,
    "mean-diff.template": _TEMPLATE,
    # ------------------------------------------------------------------ probe
    "probe.position": _POSITION,
    "probe.seed": _SEED,
    "probe.normalize": _NORMALIZE,
    "probe.test_fraction": _TEST_FRACTION,
    "probe.kl_bound": _KL_BOUND,
    "probe.template": _TEMPLATE,
    "probe.C": ("正则化系数 C", "逻辑回归的 L2 正则化强度的倒数"),
    # ------------------------------------------------------------------ pca
    "pca.position": _POSITION,
    "pca.seed": _SEED,
    "pca.normalize": _NORMALIZE,
    "pca.test_fraction": _TEST_FRACTION,
    "pca.kl_bound": _KL_BOUND,
    "pca.template": _TEMPLATE,
    "pca.center": ("中心化", "做 PCA 之前先把成对差值中心化（即 repeng 的 pca_diff）"),
    # ------------------------------------------------------------------ iti
    "iti.position": ("词元位置", "哪个词元的注意力头激活代表一行：最后一个词元（last）或各词元的平均（mean）"),
    "iti.seed": ("随机种子", "分组划分的随机种子"),
    "iti.top_heads": ("选用的注意力头数", "要引导多少个注意力头（按验证集准确率选取）"),
    "iti.val_fraction": ("验证集比例", "训练分组中用来给注意力头排序的比例"),
    "iti.test_fraction": _TEST_FRACTION,
    "iti.kl_bound": _KL_BOUND,
    "iti.template": ("文本模板", "每行文本的模板，恰好含一次 {completion}（也可含 {prompt}）"),
    "iti.steer_positions": ("引导位置", "在哪些位置引导这些注意力头：last 为最后一个提示词元以及每个生成的词元"
                                    "（honest_llama 的做法），all 为所有位置"),
    # ------------------------------------------------------------------ tsv
    "tsv.layer_sweep": ("层扫描候选数", "层留空时，先在论文所用深度附近尝试这么多个模块，保留验证集 AUROC 最好的一个"
                                      "（0：不扫描）。代价：每个模块一次简短训练（在带标签示例上训练 sweep_epochs 轮，"
                                      "再为验证行评分），约为主训练用时的 N × sweep_epochs / (init_epochs + aug_epochs)"
                                      "（N 为本项的值），靠前的模块更多；为了做出选择，会读取三分之一无标签训练行的标签"),
    "tsv.sweep_epochs": ("层扫描训练轮数", "层扫描中每个候选模块的简短训练的轮数"),
    "tsv.exemplars": ("带标签示例数", "TSV 保留其标签的带标签训练行数；其余的行使用伪标签"),
    "tsv.init_epochs": ("阶段 1 训练轮数", "阶段 1 的训练轮数（只用带标签示例）"),
    "tsv.aug_epochs": ("阶段 2 训练轮数", "阶段 2 的训练轮数（带标签示例加上高置信度的伪标签行）"),
    "tsv.logit_penalty": ("logit 惩罚", "对超过 max_logit_change 的下一个词元 logit 变化施加惩罚"
                                       "（中心化：相对于这些变化在整个词表上的均值）"),
    "tsv.max_logit_change": ("logit 变化上限", "logit 惩罚所用的 |Δlogit| 上限"),
    "tsv.kl_penalty": ("KL 惩罚", "对下一个词元分布的 KL 散度施加惩罚"),
    "tsv.generate": ("为模型自己的回答打标签", "为模型自己用贪心解码生成的回答打标签，而不用数据集中的回答"
                                            "（论文的 TruthfulQA 任务）：若一个回答与正确参考答案的最佳 ROUGE-L"
                                            "（按单词切分计算的最长公共子序列 F 值）高于它与错误参考答案的最佳值，"
                                            "该回答即为真实。auto：对 TruthfulQA 形式的数据（带有正确和错误参考答案的"
                                            "问题）取 yes，否则取 no"),
    "tsv.answer_shots": ("示范问答数", "由模型自己回答问题时：每个问题前放几个取自 TruthfulQA 问答前导提示的完整示范问答"
                                     "（0：使用模板的零样本提示词，即 TSV 论文的做法；小型基础模型没有示例时会漫无边际地"
                                     "胡说，而这样的回答得到的标签接近随机）"),
    "tsv.seed": ("随机种子", "数据划分、带标签示例的选取和初始化的随机种子"),
    "tsv.lam": ("强度 λ", "λ：向量的强度，表示为该层平均残差范数的比例（论文：在 4096 维模型上取原始值 5）"),
    "tsv.kappa": ("κ（余弦温度的倒数）", "κ：原型分类器的余弦温度的倒数（1 / 温度）"),
    "tsv.ema": ("原型滑动平均衰减", "原型的指数移动平均的衰减率"),
    "tsv.lr": ("学习率", "向量的 AdamW 学习率"),
    "tsv.selected": ("伪标签行数 K", "K：为阶段 2 保留的高置信度伪标签行数（至多为无标签行数的一半）"),
    "tsv.sinkhorn_epsilon": ("Sinkhorn 熵正则 ε", "Sinkhorn 最优传输的 ε"),
    "tsv.sinkhorn_iterations": ("Sinkhorn 迭代次数", "Sinkhorn 算法的迭代次数"),
    "tsv.batch_size": ("批大小", "每个优化步使用的行数"),
    "tsv.supervised": ("全监督", "在每一条带标签的训练行上训练；不使用伪标签"),
    "tsv.prototype_init": ("原型初始化", "原型的初始值：class_means（带标签示例的各类均值）或 random（随机，论文的做法）"),
    "tsv.logit_weight": ("logit 惩罚权重", "损失中 logit 惩罚项的权重"),
    "tsv.logit_reduction": ("logit 惩罚合并方式", "一行中超出上限的各个 logit 变化如何合并"
                                                "（mean：取平均；sum：求和；max：取最大值）"),
    "tsv.kl_weight": ("KL 惩罚权重", "损失中 KL 惩罚项的权重"),
    "tsv.bound_mode": ("上限保证方式", "如何保证 |Δlogit| 上限：steering_scale（单独的、经过校准的引导强度，惩罚项"
                                     "作用在该强度上；检测器保留训练时的强度）、calibrated（同上，但训练中不施加惩罚项）、"
                                     "projection（只有一个强度，缩小到上限以内）或 hinge（只靠软惩罚）"),
    "tsv.bound_target": ("上限目标比例", "投影或引导缩放系数所瞄准的 max_logit_change 比例：小于 1 时，为校准从未见过的"
                                       "位置留出余量（只是余量，并非保证：见 docs/tsv.md）"),
    "tsv.calibration_rows": ("校准行数", "训练结束后，用其生成位置来校准引导缩放系数的训练行数"),
    "tsv.penalty_positions": ("惩罚位置", "惩罚项约束其下一个词元 logits 的位置（answer：生成回答的位置，即最后一个"
                                        "提示词元和除最后一个以外的各回答词元；answer_and_end：再加上最后一个位置；"
                                        "last：只有最后一个位置）"),
    "tsv.penalty_tokens": ("每步惩罚位置数", "每个优化步中 logits 受惩罚的生成位置数，从惩罚行的生成位置中随机抽取"),
    "tsv.penalty_rows": ("每步惩罚行数", "每个优化步中对整个词表的 logits 施加惩罚的行数"),
    "tsv.test_fraction": ("测试集比例", "留出用于计算 AUROC 的分组比例"),
    "tsv.max_rows": ("最多行数", "为了加快速度，按完整分组下采样到大约这么多行（留空：全部）"),
    "tsv.compare": ("对照训练", "同时用相反的约束设置再训练一次，用于有约束与无约束的对比报告"),
    "tsv.bound_sweep": ("上限扫描", "额外的带约束训练，每个 |Δlogit| 上限一次"),
    "tsv.cache_batch": ("缓存批大小", "缓存冻结模块的输出时每批的文本数"),
    "tsv.template": ("问答提示词模板", "问答提示词；其中只能出现 {question} 和 {answer}"),
    # ------------------------------------------------------------------ l2s
    "l2s.context_layer": ("上下文层 L′（留空 = L*）", "L′：g 读取其最后一个提示词元的模块（留空：L*）"),
    "l2s.hidden": ("MLP 隐藏层大小（留空 = 默认）", "MLP g 的隐藏层宽度 H（留空：D/4，并限制在 100..1024 之间；"
                                              "D 为模型的隐藏维度）"),
    "l2s.position": ("目标读取位置", "目标的读取方式：补全文本各词元的平均（mean，适合短回答）或最后一个词元"
                                   "（last，适合长回答）"),
    "l2s.seed": ("随机种子", "分组划分和 g 的初始化的随机种子"),
    "l2s.epochs": ("训练轮数", "拟合 g 的最多训练轮数（早停通常会让它提前很多结束）"),
    "l2s.patience": ("早停耐心", "验证损失连续这么多轮没有改善就停止"),
    "l2s.lr": ("学习率", "Adam 学习率（> 0）"),
    "l2s.weight_decay": ("权重衰减", "Adam 的权重衰减"),
    "l2s.batch_size": ("批大小", "每个优化步使用的训练对数"),
    "l2s.cos_weight": ("余弦项权重", "加到均方误差损失上的 (1 − 余弦相似度) 项的权重"),
    "l2s.activation": ("激活函数", "g 的非线性激活函数（tanh 或 relu）"),
    "l2s.decoder_init": ("解码器初始化", "g 的解码器在第 0 轮的初值：中心化后的训练偏移的前几个主方向（svd）或零（zero）；"
                                       "两者都从均值引导开始"),
    "l2s.test_fraction": ("测试集比例", "留出用于报告的分组比例（从不用于训练）"),
    "l2s.val_fraction": ("验证集比例", "其余分组中用于早停的比例"),
    "l2s.norm_budget": ("范数预算", "引导对比的范数预算：加入向量的平均范数，表示为 L* 处典型残差范数的比例（相对单位）；"
                                  "α 在此预算内于验证集上校准，L2S 与均值引导都是如此"),
    "l2s.calibration_steps": ("α 校准步数", "在验证集上校准 α 时，在范数预算以内尝试的强度个数（1：只用预算本身）"),
    "l2s.residual_steps": ("输入相关部分权重步数", "在验证集上与 α 一起为 g 中依赖输入的部分尝试的权重个数"
                                              "（k 表示尝试 0, 1/k, …, 1，其中权重 0 即均值引导；k = 0 表示保持 g "
                                              "训练后的样子）"),
    "l2s.eval_limit": ("评估对数上限", "最多在这么多个验证集和留出集的对上为引导评分（留空：全部；余弦相似度总是用全部）"),
    "l2s.steer_positions": ("引导位置", "训练所得向量默认引导的位置（all：所有位置；prompt：提示词的位置；"
                                      "generated：生成的位置）"),
    "l2s.extract_batch": ("激活提取批大小", "每个激活提取批次的行数"),
}
