"""Documents in, documents out: each format's reader cuts a document into units of text and puts their
translations back (formats.py names them all), and sentences.py cuts units into sentences and plans what the model
translates. Torch-free; imports nothing of mt but the foundation (mt.errors): mt/decode and mt/serve use it."""
