"""The performance model: one engine step's time (`steptime`, `layoutcost`), its fit to an anchor's
measured points (`fit`), the anchors themselves (`anchors`), memory per GPU (`memory`), the
steady-state benchmark in closed form (`steady`), transfer laws (`transfer`) and the predictor."""
