//go:build !linux

package main

import "errors"

var errNoAffinity = errors.New("pinning processes to CPUs needs Linux")

func allowedCPUs() ([]int, error)          { return nil, errNoAffinity }
func pinProcess(pid int, cpus []int) error { return errNoAffinity }
func pinTree(pid int, cpus []int) error    { return errNoAffinity }
