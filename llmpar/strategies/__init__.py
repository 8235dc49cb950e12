"""llmpar's own parallel strategies, one plugin module each.

They are registered exactly as third-party plugins are: each module is named
in the `llmpar` entry-point group of llmpar's own package metadata, and
implements `llmpar_register_strategies`.
"""

BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("data", "llmpar.strategies.data"),
    ("tensor", "llmpar.strategies.tensor"),
    ("sequence", "llmpar.strategies.sequence"),
    ("context", "llmpar.strategies.context"),
    ("expert", "llmpar.strategies.expert"),
    ("pipeline", "llmpar.strategies.pipeline"),
    ("presets", "llmpar.loading.builtin_presets"),
    ("launch", "llmpar.launch.builtin"),
)
"""(entry-point name, module) of llmpar's own plugins, as in pyproject.toml."""

CHECKED_STRATEGY_MODULES = frozenset(module for _, module in BUILTIN_PLUGINS
                                      if module.startswith("llmpar.strategies."))
"""The modules of llmpar's own strategy classes, whose transforms the contract suite checks
(`tests/test_contract*`) on generated specs: the evaluator does not check them again on every
evaluation (it checks every other strategy's, a subclass's of these included)."""
