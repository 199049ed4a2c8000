# Plain loads and stores: no ordering at all.
choice = {"semantics": "plain", "scope": None}
