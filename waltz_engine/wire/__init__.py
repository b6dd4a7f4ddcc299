"""The wire layer: frames and the message codecs, byte-compatible with Waltz 0.13.2.

* ``frame``: framing, the stream ``FrameDecoder`` and ``read_frame`` for asyncio.
* ``primitives``: the payload encodings every codec shares.
* ``codec``: the spec/codec machinery; ``codecs``: every codec by (magic, version).
* ``hello``, ``client_messages``, ``storage_messages``, ``admin_messages``: the four codecs.
* ``describe``: a JSON description of any frame; ``errors``: the ProtocolError subclasses.
"""
