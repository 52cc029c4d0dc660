// Package tensortest makes the data that the tests and benchmarks of cas and
// cas/object work on: synthetic tensors (Gaussian weights in fp32, bf16 and
// fp16; a tensor before and after an optimizer step), real checkpoints cut
// into chunks the way the commit path cuts them, and the CPU time of the
// calling thread for benchmark metrics.
//
// It is imported only by tests. Every function is deterministic in its
// arguments (the seeds), so a failure reproduces.
package tensortest
