module github.com/idem-go/idem

go 1.24

toolchain go1.26.8
