// Package test holds ckptfs's end-to-end tests: Go tests that build the ckptfs
// binary and run it as a daemon, Python tests with real frameworks (test/e2e),
// and benchmarks. Nothing here is imported by the product.
package test
