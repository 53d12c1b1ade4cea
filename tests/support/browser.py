"""A headless Chrome driven by selenium: Debian's chromium through Debian's chromedriver, nothing fetched.

Both binaries are given by path (scripts/unpack-test-tools.sh unpacks them): with the driver's path on its
`Service`, selenium never runs Selenium Manager, which would otherwise look for (and download) a browser and a
driver. The profile is a folder of the test's own, never the user's. The browser's console is kept
(`goog:loggingPrefs`), so a test reads what Chromium reported there, such as a blocked script.
"""

from __future__ import annotations

from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

#: The viewport every screenshot shows, in CSS pixels at scale 1 (the page is one column, about 900 px wide).
VIEWPORT = (1000, 1700)


def start_chrome(chromium: Path, chromedriver: Path, profile: Path, log: Path) -> webdriver.Chrome:
    """A new headless Chrome on `chromium`, driven through `chromedriver`; its driver's log goes to `log`."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
        f"--user-data-dir={profile}",
        # Nothing from elsewhere: no component updates, sync, metrics or field trials (the network is local).
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=str(chromedriver), log_output=str(log))
    driver = webdriver.Chrome(options=options, service=service)
    # The window's size is not the viewport's (headless Chromium keeps room for a frame): set the viewport.
    metrics = {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    return driver
