# "A graph replays the launch, so it fails like the launch": the capture itself fails.
prediction = {
    "triton launch, peer off": "exception",
    "triton launch, peer on": "wrong result",
    "graph wrong device, peer on": "wrong result",
    "triton launch, guarded, peer on": "correct",
}
