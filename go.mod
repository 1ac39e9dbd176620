module github.com/pynox/pynox

go 1.26.8

require (
	github.com/coder/websocket v1.8.15
	github.com/landlock-lsm/go-landlock v0.11.2
	github.com/pelletier/go-toml/v2 v2.4.3
	github.com/stretchr/testify v1.12.1
	golang.org/x/sync v0.24.0
	golang.org/x/sys v0.50.0
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	kernel.org/pub/linux/libs/security/libcap/psx v1.2.78 // indirect
)
