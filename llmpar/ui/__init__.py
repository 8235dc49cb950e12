"""`llmpar ui`: a local web page that plans with llmpar.

The page (`static/`: one HTML file, plain JavaScript and CSS, no build step) edits a spec
as TOML and through a form of every key of the spec schema (`llmpar.ui.form`), and
draws what the JSON API (`llmpar.ui.api`, served by `llmpar.ui.server`) answers: the
Plan of `Session.evaluate` and the layouts of `llmpar.search`. The page computes nothing
itself. See docs/ui.md.
"""
