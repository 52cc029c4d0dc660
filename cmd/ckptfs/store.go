package main

import (
	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/cas/backend/local"
)

// openStore opens the store in dir with its chunk objects in the store's
// own objects/ directory (the local backend), unless opts says where they
// live: this command line is where cas is told which backend to use.
func openStore(dir string, opts cas.Options) (*cas.Store, error) {
	if opts.Objects == nil {
		opts.Objects = local.New(cas.ObjectsDir(dir), local.Options{})
	}
	return cas.Open(dir, opts)
}
