"""The rule language: the Lark grammar (rules.lark), the rules' AST, parsing with resolution against a
spec, literals, rule shapes and limits.
"""
