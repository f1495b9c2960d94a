package redfishtest

import "net/http"

// managerPath is the one Manager's path, served once SetFirmware gave it
// a version.
const managerPath = "/redfish/v1/Managers/BMC"

// firmware is what SetFirmware set.
type firmware struct {
	bios, bmc string
}

// SetFirmware makes the system report bios as its BiosVersion and, when
// bmc is not "", link (Links.ManagedBy) a Manager whose FirmwareVersion
// is bmc. Empty values report nothing, as the default server does.
func (s *Server) SetFirmware(bios, bmc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.firmware = firmware{bios: bios, bmc: bmc}
}

func (s *Server) firmwareNow() firmware {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firmware
}

// withFirmware adds the firmware SetFirmware set to system, the system's
// resource.
func (s *Server) withFirmware(system map[string]any) map[string]any {
	f := s.firmwareNow()
	if f.bios != "" {
		system["BiosVersion"] = f.bios
	}
	if f.bmc != "" {
		system["Links"] = map[string]any{"ManagedBy": []map[string]string{{"@odata.id": managerPath}}}
	}
	return system
}

// serveManager answers the Manager, or 404 without a BMC version.
func (s *Server) serveManager(w http.ResponseWriter, r *http.Request) {
	f := s.firmwareNow()
	if f.bmc == "" {
		httpError(w, http.StatusNotFound)
		return
	}
	serveGet(w, r, map[string]any{
		"@odata.id":       managerPath,
		"@odata.type":     "#Manager.v1_5_0.Manager",
		"Id":              "BMC",
		"Name":            "Manager",
		"FirmwareVersion": f.bmc,
	})
}
