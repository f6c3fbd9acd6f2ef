"""Inspection: a graph described node by node with its derivative rules and backward graph
(`describe`), and pictures of it as DOT text (`dot`, `draw`)."""
