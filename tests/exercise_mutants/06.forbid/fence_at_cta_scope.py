# Fences, but at block scope: they order nothing another GPU can see.
choice = {"semantics": "fence", "scope": "cta"}
