# "A wrong device always fails loudly": with peer access on, the unguarded launch runs, silently wrong.
prediction = {
    "triton launch, peer off": "exception",
    "triton launch, peer on": "exception",
    "graph wrong device, peer on": "exception",
    "triton launch, guarded, peer on": "correct",
}
