"""What the Triton paths of every op share: :mod:`.launch` (the launch table per GPU capability, ``Launch``,
``recording``, ``library_op``), :mod:`.tiles` (jitted tile helpers), :mod:`.calls` (a Triton path's call: the eager
autograd node, the library op while compiling, its failures named) and :mod:`.preflight` (the compile check on which
the torch fallback of ``impl='auto'`` rests).

Importing :mod:`.launch` or :mod:`.tiles` imports triton; the ops import them only when ``impl`` resolves to
``'triton'``, so everything else works where triton is missing.
"""
