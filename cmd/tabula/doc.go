// Command tabula is Tabula's one binary: the embedded dev cluster, the Table
// Master, the table server, and the client commands. It only parses flags and
// wires packages; everything else lives in them.
package main
