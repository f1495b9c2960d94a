package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// The simulated fleet's shape, for the failure-domains work and the faults
// of 'shepherd sim fault' (docs/simulator.md): machine sim-NNNN (index i)
// sits in rack i/RackSize, racks 2N and 2N+1 share PDU N, each rack has
// its own top-of-rack switch, and every rack is in one site. A machine's
// location is "sim-site/sim-rack-NN", its path of site and rack.

// The simulated topology's sizes and names.
const (
	// RackSize is the number of machines in a rack.
	RackSize = 40
	// RacksPerPDU is the number of racks one PDU feeds.
	RacksPerPDU = 2
	// Site is the name of the simulated fleet's one site.
	Site = "sim-site"

	rackPrefix = "sim-rack-"
	pduPrefix  = "sim-pdu-"
	torPrefix  = "sim-tor-"
)

// Topology is where a simulated machine sits: its failure domains.
type Topology struct {
	// Site is the site, Site.
	Site string
	// Rack is the machine's rack, sim-rack-NN.
	Rack string
	// PowerDomain is the PDU that feeds the rack, sim-pdu-NN.
	PowerDomain string
	// NetworkDomain is the rack's top-of-rack switch, sim-tor-NN (NN the
	// rack's number).
	NetworkDomain string
	// Location is the machine's location as the BMDB records it: the path
	// Site/Rack.
	Location string
}

// RackName, PDUName and ToRName name the n-th rack, PDU and top-of-rack
// switch.
func RackName(n int) string { return fmt.Sprintf("%s%02d", rackPrefix, n) }

// PDUName names the n-th PDU, which feeds racks RacksPerPDU*n onwards.
func PDUName(n int) string { return fmt.Sprintf("%s%02d", pduPrefix, n) }

// ToRName names the n-th rack's top-of-rack switch.
func ToRName(n int) string { return fmt.Sprintf("%s%02d", torPrefix, n) }

// TopologyOf returns the topology of the i-th simulated machine.
func TopologyOf(i int) Topology {
	rack := i / RackSize
	return Topology{
		Site:          Site,
		Rack:          RackName(rack),
		PowerDomain:   PDUName(rack / RacksPerPDU),
		NetworkDomain: ToRName(rack),
		Location:      Site + "/" + RackName(rack),
	}
}

// MachineIndex returns the index of the simulated machine whose provider
// id is providerID (sim-0042: 42), and false for a provider id that is not
// a simulated machine's.
func MachineIndex(providerID string) (int, bool) {
	digits, ok := strings.CutPrefix(providerID, "sim-")
	if !ok || len(digits) < 4 {
		return 0, false
	}
	i, err := strconv.Atoi(digits)
	if err != nil || i < 0 || ProviderID(i) != providerID {
		return 0, false
	}
	return i, true
}

// TopologyOfProviderID returns the topology of the simulated machine whose
// provider id is providerID, and false for one that is not a simulated
// machine's.
func TopologyOfProviderID(providerID string) (Topology, bool) {
	i, ok := MachineIndex(providerID)
	if !ok {
		return Topology{}, false
	}
	return TopologyOf(i), true
}

// domainNumber parses a rack's, PDU's or switch's name (prefix followed by
// its number), returning false for any other text.
func domainNumber(name, prefix string) (int, bool) {
	digits, ok := strings.CutPrefix(name, prefix)
	if !ok || len(digits) < 2 {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 || fmt.Sprintf("%s%02d", prefix, n) != name {
		return 0, false
	}
	return n, true
}

// ParseRack returns the number of the rack named name (sim-rack-NN), or of
// the rack whose top-of-rack switch it names (sim-tor-NN), and false for
// any other name.
func ParseRack(name string) (int, bool) {
	if n, ok := domainNumber(name, rackPrefix); ok {
		return n, true
	}
	return domainNumber(name, torPrefix)
}

// ParsePDU returns the number of the PDU named name (sim-pdu-NN), and false
// for any other name.
func ParsePDU(name string) (int, bool) { return domainNumber(name, pduPrefix) }

// RackMachines returns the indexes of the first and last machine of rack n
// in a fleet of machines machines; first > last when the fleet has no
// machine in it.
func RackMachines(n, machines int) (first, last int) {
	return n * RackSize, min((n+1)*RackSize, machines) - 1
}

// PDUMachines returns the indexes of the first and last machine the PDU n
// feeds in a fleet of machines machines; first > last when it feeds none.
func PDUMachines(n, machines int) (first, last int) {
	return n * RacksPerPDU * RackSize, min((n+1)*RacksPerPDU*RackSize, machines) - 1
}
