"""The rule language: schema, conditions, loading, and the shipped rule packs."""

from specguard.rules.conditions import Condition, parse_condition
from specguard.rules.schema import NoDataPolicy, Rule, RuleFile, Severity

__all__ = ["Condition", "NoDataPolicy", "Rule", "RuleFile", "Severity", "parse_condition"]
