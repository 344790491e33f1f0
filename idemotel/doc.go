package idemotel
