"""The passes over one ServingTuning: tune (the full pass), timer (what the re-tune timer does),
confirm (canaries and AnalysisTemplates) and passive (passive anchors, prediction error).

Imports run one way: timer uses tune, confirm and passive; tune uses confirm and passive; confirm
and passive use neither. The kopf handlers (handlers.py) call tune.reconcile and timer.tick.
"""
