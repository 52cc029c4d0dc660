package s3_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/ckptfs/ckptfs/cas/backend"
	"github.com/ckptfs/ckptfs/cas/backend/s3"
	"github.com/ckptfs/ckptfs/test/s3test"
)

// BenchmarkPut uploads 1 MiB chunks, Connections at a time, to versitygw on
// loopback: the ceiling of the write-back uploader on this machine.
// go test -run '^$' -bench Put ./cas/backend/s3
func BenchmarkPut(b *testing.B) {
	srv := s3test.Start(b)
	be := open(b, srv.Endpoint, s3.Options{})
	obj := randBytes(1 << 20)
	var n atomic.Int64
	b.SetBytes(int64(len(obj)))
	b.SetParallelism(be.Properties().Connections / max(1, testingProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := append([]byte(nil), obj...)
		for pb.Next() {
			i := n.Add(1)
			copy(buf, fmt.Sprint(i)) // distinct objects
			h := chunkH(fmt.Sprint("bench", i))
			if err := be.Put(context.Background(), h, buf, backend.PutOptions{IfAbsent: true}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkGet downloads 1 MiB chunks, Connections at a time.
func BenchmarkGet(b *testing.B) {
	srv := s3test.Start(b)
	be := open(b, srv.Endpoint, s3.Options{})
	const objs = 64
	for i := range objs {
		if err := be.Put(context.Background(), chunkH(fmt.Sprint("get", i)), randBytes(1<<20), backend.PutOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var n atomic.Int64
	b.SetBytes(1 << 20)
	b.SetParallelism(be.Properties().Connections / max(1, testingProcs()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 1<<20)
		for pb.Next() {
			h := chunkH(fmt.Sprint("get", n.Add(1)%objs))
			var err error
			if buf, err = be.Get(context.Background(), h, buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }
