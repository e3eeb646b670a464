package driver

// ABIVersion is the driver ABI this build speaks: the KI_ABI_VERSION the
// module must report (kinst --version shows it).
const ABIVersion = abiVersion
