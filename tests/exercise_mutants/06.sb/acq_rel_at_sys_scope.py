# MP's answer reused: release/acquire orders a store after earlier accesses, never before a later load.
sb_choice = {"semantics": "acq_rel", "scope": "sys"}
