// Package processes holds Shepherd's shipped control-loop processes, one
// package each (agentstart, recovery), and their definitions for a binary
// built on package daemon (shipped). The providers they act through live in
// providers/.
package processes
