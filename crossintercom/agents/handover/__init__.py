"""Mail as a model is handed it: framed as another agent's words (``framing``), and what one
hand-over holds and says of the rest (``mail``). Every surface that shows mail to a model renders
it here (docs/agents.md#framing, #one-hand-over).
"""
