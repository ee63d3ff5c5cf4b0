module github.com/tabuladb/tabula/bench

go 1.26.8

require github.com/tabuladb/tabula v0.0.0

require github.com/puzpuzpuz/xsync/v4 v4.5.0

replace github.com/tabuladb/tabula => ../
