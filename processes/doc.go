// Package processes holds Shepherd's shipped control-loop processes, one
// package each (agentstart, recovery), each defining itself
// (agentstart.Definition(), a controlloop.Definition) for a binary to
// register. They import controlloop, bmdb and providers, never the daemon
// or the command line, which run them. The providers they act through live
// in providers/.
package processes
