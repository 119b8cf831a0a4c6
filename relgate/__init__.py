"""relgate"""
